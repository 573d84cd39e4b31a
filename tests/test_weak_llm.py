"""The tune loop against a weak LLM: every unusable answer is a recorded verdict and the next
round's feedback; duplicates are not judged twice; budgets hold; a run without a single candidate exits
non-zero with its cause; a dead endpoint or an unknown model fails before any profiling.

Most tests run the real graph (routing, checkpoints, history) on a canned profile, so no engine starts;
answers that reach the sandbox fail its static check, which runs no process. The last test is the real
thing: `engine serve` on the embedded model (a garbage-text LLM) and `agent tune --proposer llm`.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from kernelloop.agent.cli import main as agent_main
from kernelloop.agent.loop.context import LoopContext
from kernelloop.agent.loop.graph import run_tune
from kernelloop.agent.loop.state import TuneSettings
from kernelloop.agent.proposers.base import TuneContext
from kernelloop.agent.proposers.llm import LLMEndpointError, LLMProposer, classify_answer
from kernelloop.agent.proposers.prompts import bare_code
from kernelloop.history import History
from kernelloop.kernels.candidate.static_check import static_check
from kernelloop.kernels.device import CPU
from kernelloop.kernels.ops import OPS, baseline_source, get_op
from kernelloop.kernels.registry import Registry

from tests.fake_openai import FakeOpenAI

ROOT = Path(__file__).parents[1]
OP = "silu_mul"
SHAPE = {"tokens": 7, "d": 112}
PROFILE = {"device": "cpu", "engine": "canned", "rows": [
    {"name": OP, "kind": "op", "calls": 10, "share": 0.2, "total_s": 0.01, "bytes_per_s": 1e8, "roofline_pct": 1.0,
     "shapes": [{"shape": SHAPE, "dtype": "float32", "seconds": 0.01, "calls": 10}]}]}

PROSE = "You could use larger blocks and fewer programs; I would start there."
WRONG_SIGNATURE = "Here it is:\n```python\nimport torch\n\n\ndef forward(x, y):\n    return torch.empty_like(x)\n```\n"
SYNTAX_ERROR = "```python\nimport torch\n\ndef forward(x)\n    return x\n```"


class CannedProfile(LoopContext):
    """The loop without an engine: profiling returns PROFILE."""

    def profile(self, workload):  # noqa: ANN001, ANN201
        return PROFILE


def proposer(fake: FakeOpenAI, **kw) -> LLMProposer:
    kw.setdefault("backoff_s", 0.01)
    kw.setdefault("timeout_s", 5.0)
    return LLMProposer("fake-model", fake.base_url, "dummy-key", **kw)


def tune(tmp_path: Path, llm: LLMProposer, rounds: int = 2, candidates: int = 1) -> tuple[dict, History, list[str]]:
    lines: list[str] = []
    history = History(tmp_path / "history.db")
    ctx = CannedProfile(history=history, registry=Registry(tmp_path / "registry"), proposers={"llm": llm},
                        progress=lines.append)
    try:
        state = run_tune(TuneSettings(op=OP, rounds=rounds, candidates=candidates), ctx)
    finally:
        ctx.close()
        llm.close()
    return state, history, lines


def rows(history: History) -> list[dict]:
    """Every candidate row of the history with all its verdicts, oldest first."""
    ids = [r[0] for r in history.db.execute("SELECT id FROM candidates ORDER BY id").fetchall()]
    return [history.candidate(i) for i in ids]


def told(request: dict) -> str:
    """The feedback a request carried: the user turns after the task."""
    users = [m["content"] for m in request["messages"] if m["role"] == "user"]
    return "\n".join(users[1:])


# -- each kind of weak answer: a verdict of its own, and the next round's feedback ----------------

WEAK = {
    # name: (answer, failure, words of the recorded reason, words of the next round's feedback)
    "prose": (PROSE, "no-code", f"no code block in {len(PROSE)} characters of text",
              "Nothing could be judged (no-code): no code block in"),
    "empty": ("", "no-code", "an empty answer", "Nothing could be judged (no-code): an empty answer"),
    "code-in-prose": ("Use this: def forward(x): return x * 2, it is fast.", "no-code",
                      "code outside a ```python block", "Nothing could be judged (no-code): code outside"),
    "unclosed-fence": ("Plan: one program.\n```python\nimport torch\n\ndef forward(x):\n    y = torch.empty(",
                       "truncated", "never closed, and the code is unfinished (line 4:",
                       "Nothing could be judged (truncated)"),
    "endless-text": ({"text": "Sure! " * 40, "finish_reason": "length"}, "cut-off",
                     f"cut off by max_tokens (64) before any code block ({len('Sure! ' * 40)} characters",
                     "Nothing could be judged (cut-off): cut off by max_tokens (64)"),
    "cut-in-code": ({"text": "```python\nimport torch\nimport triton\n", "finish_reason": "length"}, "cut-off",
                    "cut off by max_tokens (64) inside its code block after 2 lines of code",
                    "within the token limit"),
    "syntax-error": (SYNTAX_ERROR, "static", "line 3: syntax error",
                     "Rejected by the static check: line 3: syntax error"),
    "wrong-signature": (WRONG_SIGNATURE, "static", "line 4: forward takes 2 positional arguments, the op passes 1 (x)",
                        "forward takes 2 positional arguments"),
}


@pytest.mark.parametrize("kind", sorted(WEAK))
def test_a_weak_answer_is_a_recorded_verdict_and_the_next_rounds_feedback(tmp_path: Path, kind: str) -> None:
    answer, failure, reason, feedback = WEAK[kind]
    with FakeOpenAI([answer, PROSE]) as fake:
        state, history, lines = tune(tmp_path, proposer(fake, max_tokens_per_round=64))
        requests = list(fake.requests)
    assert len(requests) == 2 and requests[0]["max_tokens"] == 64
    first, second = rows(history)
    assert first["proposer"] == "llm" and first["model"] == "fake-model" and first["tokens_prompt"] > 0
    [verdict] = first["verdicts"]
    assert verdict["failure"] == failure and reason in verdict["reason"], verdict["reason"]
    assert verdict["stage"] == ("static" if failure == "static" else "proposal") and not verdict["accepted"]
    if failure != "static":
        assert first["source"] == (answer if isinstance(answer, str) else answer["text"])  # the answer as given
    assert feedback in told(requests[1])                            # round 2 was told
    assert second["verdicts"][0]["failure"] == "no-code"             # and round 2's answer was recorded too
    assert [j["verdict"]["failure"] for j in state["judged"]] == [failure, "no-code"]
    if failure == "static":  # a candidate reached the sandbox: the run simply found no winner
        assert state["status"] == "no-winner"
    else:
        assert state["status"] == "no-candidate" and state["reason"].startswith(
            "the LLM proposer produced no candidate in 2 rounds: ")
    run = history.runs(limit=1)[0]
    assert run["status"] == state["status"] and run["finished_at"]
    history.close()


def test_a_repeated_module_is_recorded_as_a_duplicate_and_not_judged_twice(tmp_path: Path) -> None:
    again = "Same as before:\n" + WRONG_SIGNATURE
    with FakeOpenAI([[WRONG_SIGNATURE, WRONG_SIGNATURE], [again, PROSE], [PROSE, PROSE]]) as fake:
        state, history, _ = tune(tmp_path, proposer(fake), rounds=3, candidates=2)
        requests = list(fake.requests)
    assert len(requests) == 3                                         # 3 rounds, 2 choices each
    candidates = rows(history)
    assert len(candidates) == 6                                       # every answer is a row
    original, *rest = candidates
    assert [v["failure"] for v in original["verdicts"]] == ["static"]  # judged once
    duplicates = [c for c in rest if c["verdicts"][0]["failure"] == "duplicate"]
    assert len(duplicates) == 2 and all(c["parent_id"] == original["id"] for c in duplicates)
    same_round, next_round = (d["verdicts"][0]["reason"] for d in duplicates)
    assert f"the same module as llm fake-model round 1 choice 1 (candidate {original['id']}" in same_round
    assert "judged in this round" in same_round
    assert "static: line 4: forward takes 2 positional arguments" in next_round
    assert history.db.execute("SELECT count(*) FROM verdicts").fetchone()[0] == 6
    assert "Not judged again (duplicate): the same module as" in told(requests[1])
    assert "change the approach" in told(requests[2])
    assert state["status"] == "no-winner"                             # one candidate reached the sandbox
    history.close()


# -- a run without a single candidate ------------------------------------------------------------

def test_every_answer_unusable_exits_non_zero_with_the_cause(tmp_path: Path, monkeypatch, capsys) -> None:
    script = [PROSE, {"text": "la " * 30, "finish_reason": "length"}, ""]
    monkeypatch.setattr("kernelloop.agent.loop.context.LoopContext", CannedProfile)  # no engine: the canned profile (tune imports it when it runs)
    with FakeOpenAI(script) as fake:
        monkeypatch.setenv("OPENAI_BASE_URL", fake.base_url)
        code = agent_main(["tune", OP, "--proposer", "llm", "--llm-model", "fake-model", "--device", "cpu",
                           "--rounds", "3", "--candidates", "1", "--llm-max-tokens", "32",
                           "--registry", str(tmp_path / "reg"), "--history", str(tmp_path / "h.db")])
        paths, requests = list(fake.paths), list(fake.requests)
    out, err = capsys.readouterr()
    assert code == 1
    cause = ("the LLM proposer produced no candidate in 3 rounds: 2 answers without a code block, "
             "1 cut off by max_tokens")
    result = [line for line in out.splitlines() if line.startswith("result:")]
    assert result == [f"result: no-candidate: {cause}"], out
    assert paths[0] == "/v1/models" and len(requests) == 3 and all(r["max_tokens"] == 32 for r in requests)
    assert "serves fake-model" in err
    with History(tmp_path / "h.db") as history:
        attempts = history.attempts(op=OP)
        run = history.runs(limit=1)[0]
    assert sorted(a["failure"] for a in attempts) == ["cut-off", "no-code", "no-code"]
    assert run["status"] == "no-candidate" and run["detail"]["reason"] == cause


def test_a_dead_endpoint_ends_the_run_after_one_round_with_its_error(tmp_path: Path) -> None:
    with FakeOpenAI([401]) as fake:
        state, history, lines = tune(tmp_path, proposer(fake), rounds=3)
    assert len(fake.requests) == 1 and state["status"] == "no-candidate"
    assert state["reason"].startswith("the LLM proposer produced no candidate in 1 round: no answer; HTTP 401 "
                                      "from the endpoint (not retried)")
    assert rows(history) == [] and history.runs(limit=1)[0]["status"] == "no-candidate"
    history.close()


# -- the endpoint check: one line, before any profiling ------------------------------------------

def _tune_cli(tmp_path: Path, base_url: str, model: str, monkeypatch, capsys) -> tuple[int, str, str]:
    monkeypatch.setenv("OPENAI_BASE_URL", base_url)
    started = time.monotonic()
    code = agent_main(["tune", OP, "--proposer", "llm", "--llm-model", model, "--device", "cpu",
                       "--registry", str(tmp_path / "reg"), "--history", str(tmp_path / "h.db")])
    assert time.monotonic() - started < 15
    out, err = capsys.readouterr()
    return code, out, err


def test_an_unreachable_endpoint_fails_fast_before_profiling(tmp_path: Path, monkeypatch, capsys) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code, out, err = _tune_cli(tmp_path, f"http://127.0.0.1:{port}/v1", "fake-model", monkeypatch, capsys)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith(f"agent tune: the LLM endpoint http://127.0.0.1:{port}/v1 "
                                                   "is unreachable: "), err
    assert not (tmp_path / "h.db").exists()  # nothing was profiled or recorded


def test_a_model_the_endpoint_does_not_serve_fails_fast_before_profiling(tmp_path: Path, monkeypatch, capsys) -> None:
    with FakeOpenAI([]) as fake:
        base = fake.base_url
        code, out, err = _tune_cli(tmp_path, base, "gpt-4o", monkeypatch, capsys)
    assert code == 2 and out == ""
    assert err == (f"agent tune: the LLM endpoint {base} does not serve the model 'gpt-4o' "
                   "(it serves 'fake-model'); pass --llm-model\n")
    assert fake.paths == ["/v1/models"] and fake.requests == []
    assert not (tmp_path / "h.db").exists()


# -- a model with a small context window --------------------------------------------------------

def _ctx() -> TuneContext:
    return TuneContext(spec=get_op(OP), dtype="float32", device=CPU, shapes=(SHAPE,), best_source=None,
                       baseline_source=baseline_source(OP), roofline={}, failures=())


def test_a_prompt_too_long_for_the_model_is_compacted() -> None:
    too_long = {"status": 400, "message": "the prompt has 3620 tokens; this engine serves at most 2047"}
    with FakeOpenAI([too_long, PROSE, PROSE], max_model_len=2048) as fake:
        with proposer(fake) as p:
            assert "(2048-token context)" in p.check_endpoint() and p.context_tokens == 2048
            assert p.propose(_ctx(), [], 1) == [] and p.compact and p.last_error is None
            p.propose(_ctx(), p.rejected, 1)
        full, compact, again = (r["messages"] for r in fake.requests)
    assert "## Reference implementation" in full[1]["content"]
    assert [m["role"] for m in compact] == ["system", "user"] and "## Reference" not in compact[1]["content"]
    assert "def forward(x)" in compact[1]["content"] and len(compact[1]["content"]) < len(full[1]["content"]) / 2
    assert [m["role"] for m in again] == ["system", "user"]  # the feedback folded into the one user turn
    assert "Your previous answer: Nothing could be judged (no-code)" in again[1]["content"]


@pytest.mark.parametrize("op", sorted(OPS))
def test_the_compact_task_shows_a_valid_current_kernel(op: str) -> None:
    shown = bare_code(baseline_source(op))
    assert static_check(shown, get_op(op).arg_names).ok and '"""' not in shown and "#" not in shown


def test_a_server_that_refuses_n_and_a_long_prompt_gets_compact_single_choice_requests() -> None:
    refuse_n = {"status": 400, "message": "only n=1 is supported"}  # what `engine serve` says
    too_long = {"status": 400, "message": "the prompt has 3620 tokens; this engine serves at most 2047"}
    with FakeOpenAI([refuse_n, too_long, PROSE, PROSE]) as fake:
        with proposer(fake) as p:
            assert p.propose(_ctx(), [], 2) == [] and p.last_error is None
            assert [v["failure"] for _, v in p.rejected] == ["no-code", "no-code"]
    assert [r.get("n") for r in fake.requests] == [2, None, None, None]


def test_a_prompt_too_long_even_compacted_is_one_error() -> None:
    too_long = {"status": 400, "message": "This model's maximum context length is 512 tokens"}
    with FakeOpenAI([too_long, too_long]) as fake:
        with proposer(fake) as p:
            assert p.propose(_ctx(), [], 1) == []
    assert len(fake.requests) == 2
    assert p.last_error == ("the prompt does not fit the model's context, even compacted: HTTP 400: Error code: 400 - "
                            "This model's maximum context length is 512 tokens")


# -- reading answers -------------------------------------------------------------------------------

@pytest.mark.parametrize("text, finish, expected", [
    ("```python\ndef forward(x):\n    return x\n```", "stop", "module"),
    ("```python\ndef forward(x):\n    return x\n```\nThat is all, and then", "length", "module"),  # block complete
    ("import torch\n\ndef forward(x):\n    return x\n", "stop", "module"),          # no fence, a whole module
    ("```python\nimport torch\n\ndef forward(x):\n    return x\n", "stop", "module"),  # only the closing fence lost
    ("```python\nimport torch\n\ndef forward(x):\n    return x\n", "length", "cut-off"),
    ("```python\nimport torch\n\ndef forward(x):\n    return (x\n", "stop", "truncated"),
    ("```python\n", "stop", "truncated"),
    ("```text\nnot code\n```", "stop", "no-code"),
    ("   \n", "stop", "no-code"),
    ("words " * 10, "length", "cut-off"),
])
def test_classify_answer(text: str, finish: str, expected: str) -> None:
    source, failure, reason = classify_answer(text, finish, 100)
    assert (failure or "module") == expected and (source is None) == (failure is not None)
    assert bool(reason) == (failure is not None)


def test_the_endpoint_check_reports_http_errors_in_one_line() -> None:
    with FakeOpenAI([]) as fake:
        base = fake.base_url
        with LLMProposer("fake-model", base + "/nope", "k") as p:
            with pytest.raises(LLMEndpointError) as info:
                p.check_endpoint()
    assert str(info.value).startswith(f"the LLM endpoint {base}/nope answered GET /models with HTTP 404")
    assert "\n" not in str(info.value)


# -- the real thing: our own engine as a (very) weak LLM ---------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_agent_tune_with_engine_serve_as_the_llm(tmp_path: Path) -> None:
    from tests.hf_checkpoints import make_checkpoint

    port = _free_port()
    base = f"http://127.0.0.1:{port}/v1"
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    server = subprocess.Popen([sys.executable, "-m", "kernelloop.engine.cli", "serve", "--port", str(port), "--device", "cpu",
                               "--served-model-name", "tiny-llm"], cwd=ROOT, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        model_dir = make_checkpoint(tmp_path / "ckpt", "gqa")  # the engine being tuned (while the server starts)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and server.poll() is None:
            try:
                if httpx.get(f"{base}/models", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        assert server.poll() is None, server.stderr.read()
        rounds, candidates = 3, 2
        started = time.monotonic()
        result = subprocess.run(
            [sys.executable, "-m", "kernelloop.agent.cli", "tune", OP, "--proposer", "llm", "--llm-model", "tiny-llm",
             "--llm-max-tokens", "48", "--llm-timeout", "30", "--model", str(model_dir), "--device", "cpu",
             "--rounds", str(rounds), "--candidates", str(candidates), "--registry", str(tmp_path / "reg"),
             "--history", str(tmp_path / "h.db"), "--json", "--gate-runaway-tokens", "0", "--gate-invariance-tokens", "0"],
            cwd=ROOT, env={**env, "OPENAI_BASE_URL": base, "OPENAI_API_KEY": "none"},
            capture_output=True, text=True, timeout=120)
        elapsed = time.monotonic() - started
    finally:
        server.terminate()
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    assert result.returncode in (0, 1), result.stderr[-3000:]
    state = json.loads(result.stdout)
    assert "serves tiny-llm (2048-token context)" in result.stderr
    assert "profiling the engine" in result.stderr
    with History(tmp_path / "h.db") as history:
        attempts = history.attempts(op=OP, limit=100)
        run = history.runs(limit=1)[0]
    # every answer of every round is a row with a verdict; the budgets held
    assert state["round"] == rounds or (state["status"] == "winner" and state["round"] < rounds), result.stderr
    assert len(attempts) == len(state["judged"]) <= rounds * candidates
    assert all(a["failure"] or a["accepted"] for a in attempts)
    assert all(a["proposer"] == "llm" and a["model"] == "tiny-llm" and (a["tokens_completion"] or 0) <= 48
               for a in attempts)
    assert run["status"] == state["status"] and run["finished_at"]
    if result.returncode == 1:  # what a garbage-text model earns: no candidate, and the cause
        assert state["status"] == "no-candidate"
        assert state["reason"].startswith(f"the LLM proposer produced no candidate in {rounds} rounds: ")
        assert result.stderr.rstrip().splitlines()[-1] == f"agent tune: {state['reason']}"
    else:
        assert state["status"] in ("winner", "no-winner")
    assert elapsed < 90, elapsed
