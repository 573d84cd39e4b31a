"""The LLM proposer against a real HTTP fake of an OpenAI-compatible server (tests/fake_openai.py)."""

from __future__ import annotations

import dataclasses
import inspect
import socket
import threading
import time

import pytest

from kernelloop.agent.proposers.base import Proposal, TuneContext
from kernelloop.agent.proposers.llm import LLMProposer
from kernelloop.agent.proposers.prompts import task_prompt
from kernelloop.kernels.candidate.static_check import ALLOWED_IMPORTS, static_check
from kernelloop.kernels.device import CPU
from kernelloop.kernels.ops import OPS, baseline_source, get_op

from tests.fake_openai import FakeOpenAI

CODE1 = '''import torch
import triton
import triton.language as tl


@triton.jit
def _k(x_ptr, w_ptr, y_ptr, n, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    m = cols < n
    x = tl.load(x_ptr + row * n + cols, mask=m, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=m, other=0.0).to(tl.float32)
    y = x * tl.rsqrt(tl.sum(x * x, axis=0) / n + eps) * w
    tl.store(y_ptr + row * n + cols, y.to(y_ptr.dtype.element_ty), mask=m)


def forward(x, weight, eps):
    n = x.shape[-1]
    y = torch.empty_like(x)
    _k[(x.numel() // n,)](x, weight, y, n, eps, BLOCK=triton.next_power_of_2(n))
    return y
'''
CODE2 = CODE1.replace("_k[", "_k [").replace("def _k(", "def _k (")
BEST = "# registry entry rmsnorm-abc123 (current best)\n" + CODE1
STATIC_REASON = ("line 3: import of 'os' is not allowed (allowed: __future__, dataclasses, enum, functools, "
                 "itertools, math, operator, torch, triton, typing)")
MISMATCH_REASON = ("bfloat16 {'tokens': 3, 'hidden': 33} seed 17: 5/99 elements outside atol=0.01 rtol=0.016; "
                   "max abs err 0.75 at [2, 31] (got 1.5, expected 0.75)")
NOT_FASTER_REASON = "1.012x [0.981, 1.046] over baseline: the interval's lower bound must exceed 1.03"


def reply(code: str, plan: str = "Plan: one program per block of rows.") -> str:
    return f"{plan}\n\n```python\n{code}```\n"


def verdict(failure: str | None, reason: str, **extra) -> dict:
    v = {"op": "rmsnorm", "device": "cpu-interpreter", "file": "<candidate>", "sha256": "0" * 64,
         "correct": failure in (None, "not-faster", "impossible-speedup"), "accepted": failure is None,
         "speedup": None, "speedup_interval": None, "reason": reason, "failure": failure, "stage": "done",
         "baseline": "baseline", "timing": {}, "checks": [], "isolation": {}, "log_tail": "", "duration_s": 1.0}
    v.update(extra)
    return v


NOT_FASTER_TIMING = {
    "shape": {"tokens": 7, "hidden": 2880}, "dtype": "bfloat16", "rounds": 5, "calls_per_round": 3,
    "baseline_s": 0.0123, "candidate_s": 0.0121, "modes": ["eager"],
    "achieved_bytes_per_s": 6.7e6, "copy_bandwidth_bytes_per_s": 2.0e10, "roofline_fraction": 3.35e-4,
}
VERDICTS = {
    "static": verdict("static", STATIC_REASON, stage="static"),
    "load": verdict("load", "importing the candidate failed: NameError: name 'tl' is not defined",
                    log_tail="Traceback (most recent call last):\n  ...\nNameError: name 'tl' is not defined"),
    "sandbox-violation": verdict("sandbox-violation", "trial 1: blocked open('/etc/passwd', 'r')"),
    "mismatch": verdict("mismatch", "trial 2 " + MISMATCH_REASON),
    "not-faster": verdict("not-faster", NOT_FASTER_REASON, speedup=1.012, speedup_interval=[0.981, 1.046],
                          timing=NOT_FASTER_TIMING),
}


@pytest.fixture
def ctx() -> TuneContext:
    return TuneContext(
        spec=get_op("rmsnorm"), dtype="bfloat16", device=CPU,
        shapes=({"tokens": 7, "hidden": 2880}, {"tokens": 1, "hidden": 2880}, {"tokens": 300, "hidden": 4096}),
        best_source=None, baseline_source=baseline_source("rmsnorm"),
        roofline={"bytes_per_s": 1.3e9, "roofline_pct": 6.2, "device_bytes_per_s": 2.0e10},
        failures=(
            {"source": "import os\n", "failure": "static", "reason": "line 1: import of 'os' is not allowed"},
            {"source": CODE1, "failure": "mismatch", "reason": "float32 {'tokens': 3}: max abs err 0.5 at [0, 7]"},
        ),
    )


_OPEN: list[LLMProposer] = []


@pytest.fixture(autouse=True)
def _no_leftovers():
    """Every proposer's HTTP client is closed and every server thread a test started has ended."""
    before = set(threading.enumerate())
    yield
    while _OPEN:
        _OPEN.pop().close()
    deadline = time.monotonic() + 3.0
    while time.monotonic() < deadline and set(threading.enumerate()) - before:
        time.sleep(0.02)
    assert not set(threading.enumerate()) - before, "threads left running"


def proposer(fake: FakeOpenAI, **kw) -> LLMProposer:
    kw.setdefault("backoff_s", 0.01)
    kw.setdefault("timeout_s", 5.0)
    p = LLMProposer("fake-model", fake.base_url, "dummy-key", **kw)
    _OPEN.append(p)
    return p


def user_turns(request: dict) -> list[str]:
    return [m["content"] for m in request["messages"] if m["role"] == "user"]


# -- round 1 -------------------------------------------------------------------------------------

def test_round1_prompt_carries_spec_reference_kernel_profile_device_rules_and_failures(ctx):
    with FakeOpenAI([reply(CODE1)]) as fake:
        p = proposer(fake)
        proposals = p.propose(ctx, [], 1)
    assert len(fake.requests) == 1
    body = fake.requests[0]
    assert body["model"] == "fake-model" and body["max_tokens"] == 8000 and "tools" not in body
    assert [m["role"] for m in body["messages"]] == ["system", "user"]
    task = body["messages"][1]["content"]
    spec = get_op("rmsnorm")
    assert spec.signature in task and spec.summary in task
    assert "bfloat16: atol=0.01 rtol=0.016" in task                     # tolerances
    assert inspect.getsource(spec.reference).strip() in task             # reference source
    # the baseline kernel file, a candidate module (no spec plumbing, no kernels.* imports)
    assert baseline_source("rmsnorm").strip() in task
    assert "def _rmsnorm_kernel(" in task and "SPEC = OpSpec(" not in task and "from kernels" not in task
    assert '{"hidden": 2880, "tokens": 7}' in task and '{"hidden": 4096, "tokens": 300}' in task
    assert "dtype: bfloat16" in task
    assert "Triton's interpreter" in task and "about 1 ms" in task and "fewer program instances wins" in task
    assert "1.3 GB/s" in task and "6.2% of the roofline" in task           # roofline figures
    assert "def forward(x, weight, eps)" in task
    assert ", ".join(sorted(ALLOWED_IMPORTS)) in task
    assert "Mask every tl.load and tl.store" in task and "float32" in task
    assert "[static] line 1: import of 'os' is not allowed" in task       # failed attempts
    assert "[mismatch] float32 {'tokens': 3}: max abs err 0.5 at [0, 7]" in task

    assert len(proposals) == 1
    prop = proposals[0]
    usage = fake.responses[0]["usage"]
    assert prop.source == CODE1
    assert (prop.proposer, prop.model, prop.label) == ("llm", "fake-model", "llm fake-model round 1 choice 1")
    assert prop.prompt == task
    assert (prop.tokens_prompt, prop.tokens_completion) == (usage["prompt_tokens"], usage["completion_tokens"])
    assert p.tokens_used == usage["total_tokens"] and p.last_error is None


def test_current_best_kernel_is_shown_instead_of_the_baseline(ctx):
    ctx = TuneContext(**{**ctx.__dict__, "best_source": BEST})
    with FakeOpenAI([reply(CODE1)]) as fake:
        proposer(fake).propose(ctx, [], 1)
    task = fake.requests[0]["messages"][1]["content"]
    assert BEST.strip() in task and "def _rmsnorm_kernel(" not in task


def test_gpu_device_facts(ctx, monkeypatch):
    from kernelloop.kernels import device

    monkeypatch.setattr(device, "_fingerprint", lambda kind: "NVIDIA H200 sm90")  # the GPU's, without one
    ctx = TuneContext(**{**ctx.__dict__, "device": device.CUDA,
                         "roofline": {"bytes_per_s": 2.4e12, "roofline_pct": 52.0, "device_bytes_per_s": 4.6e12}})
    with FakeOpenAI([reply(CODE1)]) as fake:
        proposer(fake).propose(ctx, [], 1)
    task = fake.requests[0]["messages"][1]["content"]
    assert "NVIDIA H200 sm90" in task and "4600.0 GB/s copy bandwidth" in task and "interpreter" not in task


def test_n_choices_in_one_request_split_the_tokens(ctx):
    with FakeOpenAI([[reply(CODE1), reply(CODE2), "no code here"]]) as fake:
        proposals = proposer(fake).propose(ctx, [], 3)
    assert len(fake.requests) == 1 and fake.requests[0]["n"] == 3
    assert [p.source for p in proposals] == [CODE1, CODE2]
    assert [p.label for p in proposals] == ["llm fake-model round 1 choice 1", "llm fake-model round 1 choice 2"]
    usage = fake.responses[0]["usage"]
    assert all(p.tokens_prompt == usage["prompt_tokens"] // 3 for p in proposals)
    assert all(p.tokens_completion == usage["completion_tokens"] // 3 for p in proposals)


def test_a_server_that_honours_n(ctx):
    with FakeOpenAI([reply(CODE2)], honor_n=True) as fake:
        proposals = proposer(fake).propose(ctx, [], 2)
    assert len(fake.requests) == 1 and [x.source for x in proposals] == [CODE2, CODE2]


def test_a_server_that_ignores_n_is_asked_again(ctx):
    with FakeOpenAI([reply(CODE1), reply(CODE2), reply(CODE1)]) as fake:
        p = proposer(fake)
        proposals = p.propose(ctx, [], 2)
        again = p.propose(ctx, [], 2)
    assert [x.source for x in proposals] == [CODE1, CODE2]
    assert fake.requests[0]["n"] == 2 and "n" not in fake.requests[1]
    assert len(again) == 1 and p.last_error and "script exhausted" in p.last_error  # one n=1 call per choice now
    assert "n" not in fake.requests[2]


def test_a_server_that_refuses_n_gets_single_choice_requests(ctx):
    with FakeOpenAI([400, reply(CODE1), reply(CODE2)]) as fake:
        p = proposer(fake)
        proposals = p.propose(ctx, [], 2)
    assert [x.source for x in proposals] == [CODE1, CODE2] and p.last_error is None
    assert fake.requests[0]["n"] == 2 and "n" not in fake.requests[1] and "n" not in fake.requests[2]


def test_tool_call_submission(ctx):
    call = {"tool_call": {"name": "submit_kernel", "arguments": {"source": CODE2}}}
    with FakeOpenAI([call]) as fake:
        proposals = proposer(fake, use_tools=True).propose(ctx, [], 1)
    tools = fake.requests[0]["tools"]
    assert tools[0]["function"]["name"] == "submit_kernel"
    assert tools[0]["function"]["parameters"]["required"] == ["source"]
    assert [p.source for p in proposals] == [CODE2]


# -- multi-round refinement ----------------------------------------------------------------------

@pytest.mark.parametrize("code, expected", [
    ("static", [STATIC_REASON]),
    ("mismatch", [MISMATCH_REASON]),
    ("not-faster", ["speedup 1.012x", "[0.981, 1.046]", NOT_FASTER_REASON, "12.100 ms vs baseline 12.300 ms"]),
])
def test_round2_replays_round1_code_and_its_verdict(ctx, code, expected):
    with FakeOpenAI([reply(CODE1), reply(CODE2)]) as fake:
        p = proposer(fake)
        first = p.propose(ctx, [], 1)
        other = Proposal(source="def forward(x, weight, eps):\n    pass\n", proposer="sweep", label="sweep 1")
        feedback = [(first[0], VERDICTS[code]), (other, VERDICTS["load"])]
        second = p.propose(ctx, feedback, 1)
    messages = fake.requests[1]["messages"]
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]  # the sweep's is not ours
    assert messages[1] == fake.requests[0]["messages"][1]                          # same task
    assert CODE1.strip() in messages[2]["content"] and messages[2]["content"].startswith("```python")
    for text in expected:
        assert text in messages[3]["content"]
    assert [x.source for x in second] == [CODE2]
    assert second[0].label == "llm fake-model round 2 choice 1"
    assert second[0].prompt == messages[3]["content"]


def test_reply_without_code_yields_nothing_and_is_told_next_round(ctx):
    prose = "You could use larger blocks and fewer programs; I would start there."
    with FakeOpenAI([prose, reply(CODE1)]) as fake:
        p = proposer(fake)
        assert p.propose(ctx, [], 1) == [] and p.last_error is None
        [(answer, verdict)] = p.rejected                  # the loop records it and passes it back
        assert answer.source == prose and answer.label == "llm fake-model round 1 choice 1"
        assert (verdict["failure"], verdict["stage"], verdict["accepted"]) == ("no-code", "proposal", False)
        proposals = p.propose(ctx, [(answer, verdict)], 1)
    messages = fake.requests[1]["messages"]
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
    assert messages[2]["content"] == prose
    assert "Nothing could be judged (no-code): no code block" in messages[3]["content"]
    assert "one ```python fenced block" in messages[3]["content"]
    assert [x.source for x in proposals] == [CODE1] and p.rejected == []


def test_truncated_reply_is_reported_as_cut_off(ctx):
    cut = {"choices": [{"index": 0, "finish_reason": "length", "logprobs": None,
                        "message": {"role": "assistant", "content": "```python\nimport torch\ndef forw"}}]}
    with FakeOpenAI([cut, reply(CODE1)]) as fake:
        p = proposer(fake, max_tokens_per_round=16)
        assert p.propose(ctx, [], 1) == []
        p.propose(ctx, p.rejected, 1)
    told = fake.requests[1]["messages"][-1]["content"]
    assert "Nothing could be judged (cut-off): cut off by max_tokens (16) inside its code block" in told
    assert "within the token limit" in told


# -- endpoint trouble ----------------------------------------------------------------------------

@pytest.mark.parametrize("trouble", [500, 503, "garbage", "empty", {"raw": "<html>bad gateway</html>"}])
def test_transient_trouble_is_retried(ctx, trouble):
    with FakeOpenAI([trouble, reply(CODE1)]) as fake:
        p = proposer(fake)
        proposals = p.propose(ctx, [], 1)
    assert [x.source for x in proposals] == [CODE1] and p.last_error is None
    assert len(fake.requests) == 2 and fake.requests[0] == fake.requests[1]


def test_timeout_is_retried(ctx):
    with FakeOpenAI(["sleep:3", reply(CODE1)]) as fake:
        p = proposer(fake, timeout_s=1.0)
        t0 = time.monotonic()
        proposals = p.propose(ctx, [], 1)
        elapsed = time.monotonic() - t0
    assert [x.source for x in proposals] == [CODE1] and p.last_error is None
    assert 0.9 < elapsed < 2.8


def test_all_retries_failing_gives_nothing_and_a_reason_quickly(ctx):
    with FakeOpenAI([500, "garbage", 502, 500, reply(CODE1)]) as fake:
        p = proposer(fake, retries=3)
        t0 = time.monotonic()
        proposals = p.propose(ctx, [], 2)
        elapsed = time.monotonic() - t0
    assert proposals == [] and len(fake.requests) == 4 and elapsed < 2.0
    assert p.last_error == "HTTP 500: Error code: 500 - scripted status 500 (gave up after 4 attempts)"


@pytest.mark.parametrize("status", [401, 404])
def test_client_errors_are_not_retried(ctx, status):
    with FakeOpenAI([status, reply(CODE1)]) as fake:
        p = proposer(fake)
        assert p.propose(ctx, [], 1) == []
    assert len(fake.requests) == 1
    assert p.last_error.startswith(f"HTTP {status} from the endpoint (not retried)")


def test_unreachable_endpoint(ctx):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with LLMProposer("m", f"http://127.0.0.1:{port}/v1", "k", retries=2, backoff_s=0.01, timeout_s=2) as p:
        assert p.propose(ctx, [], 1) == []
        assert p.last_error.startswith("connection error") and "3 attempts" in p.last_error


# -- budget --------------------------------------------------------------------------------------

def test_token_budget_exhausted_returns_nothing_without_calling(ctx):
    with FakeOpenAI([reply(CODE1), reply(CODE2)]) as fake:
        p = proposer(fake, token_budget=50)   # the first prompt alone is ~2000 tokens
        assert len(p.propose(ctx, [], 1)) == 1
        assert p.tokens_used >= 50
        assert p.propose(ctx, [], 1) == []
    assert len(fake.requests) == 1
    assert p.last_error.startswith("token budget exhausted")
    with FakeOpenAI([reply(CODE1)]) as fake:
        assert proposer(fake, token_budget=0).propose(ctx, [], 1) == []
    assert fake.requests == []


def test_defaults_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with LLMProposer("m") as p:
        assert str(p.client.base_url).startswith("http://127.0.0.1:9/v1") and p.client.api_key == "EMPTY"
        assert p.client.max_retries == 0


# -- prompt pieces -------------------------------------------------------------------------------

@pytest.mark.parametrize("op", sorted(OPS))
def test_baselines_are_shown_in_candidate_form(op, ctx):
    """The task shows the op's baseline kernel file as it is: a legal candidate, no AST surgery."""
    source = baseline_source(op)
    assert static_check(source, get_op(op).arg_names).ok
    assert "def forward(" in source and "def make_inputs" not in source and "SPEC =" not in source
    task = task_prompt(dataclasses.replace(ctx, spec=get_op(op), baseline_source=source, failures=()))
    assert "```python\n" + source.rstrip() + "\n```" in task


