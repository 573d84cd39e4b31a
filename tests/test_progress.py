"""Progress (#14): Steps from the sandbox, profiler and gate; plain lines off a terminal, bars on one."""

from __future__ import annotations

import asyncio
import io
import pickle
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from rich.console import Console

from kernelloop.agent.progress_view import ProgressView
from kernelloop.agent.render import throttled
from kernelloop.common.progress import Step, prefixed, takes_every_step
from kernelloop.kernels.device import CPU

BATTERY = [Step("trial 1/3 (float32 a)", "sandbox battery", 1, 3), Step("trial 2/3 (float32 b)", "sandbox battery", 2, 3),
           "checking cand_b", Step("trial 1/3 (float32 a)", "sandbox battery", 1, 3)]


# -- the value --------------------------------------------------------------------------------------

def test_a_step_is_its_text_and_keeps_its_position_through_a_prefix_and_pickle() -> None:
    step = Step("timing round 3/7", "sandbox timing", 3, 7, deadline=123.0, detail="d")
    assert step == "timing round 3/7" and isinstance(step, str) and f"{step}!" == "timing round 3/7!"
    shown = prefixed("    sandbox: ", step)
    assert isinstance(shown, Step) and shown == "    sandbox: timing round 3/7"
    assert (shown.task, shown.done, shown.total, shown.deadline, shown.detail) == ("sandbox timing", 3, 7, 123.0, "d")
    back = pickle.loads(pickle.dumps(shown))
    assert back == shown and (back.task, back.done, back.total) == ("sandbox timing", 3, 7)
    assert prefixed("  profile: ", "plain") == "  profile: plain" and type(prefixed("x", "y")) is str
    assert step.seconds_left(now=120.0) == 3.0 and step.seconds_left(now=200.0) == 0.0
    assert Step("x", "t", 1, 2).seconds_left() is None


# -- off a terminal: plain lines, as before ---------------------------------------------------------

def test_plain_view_prints_every_message_as_its_text() -> None:
    lines: list[str] = []
    with ProgressView(lines.append, live=False) as view:
        assert not view.takes_every_step
        for message in BATTERY:
            view(message)
        view(Step("  gate round 1/3: tokens/s before 1.0, after 1.1 (1.10x)", "gate rounds", 1, 3, log=True))
    assert lines == [str(m) for m in BATTERY] + ["  gate round 1/3: tokens/s before 1.0, after 1.1 (1.10x)"]
    assert view.shown() == {}


def test_throttle_off_a_terminal_drops_steps_and_strings_alike() -> None:
    lines: list[str] = []
    with ProgressView(lines.append, live=False) as view:
        progress = throttled(view, every_s=3600, prefix="    sandbox: ")
        for message in BATTERY:
            progress(message)
    assert lines == ["    sandbox: trial 1/3 (float32 a)"]  # the first at once, then nothing within the hour


def test_throttle_passes_every_step_to_bars_but_no_extra_line() -> None:
    lines: list[str] = []
    console = Console(file=io.StringIO(), force_terminal=True, width=120)
    with ProgressView(lines.append, live=True, console=console) as view:
        assert view.takes_every_step and takes_every_step(view)
        progress = throttled(view, every_s=3600, prefix="    sandbox: ")
        progress(Step("trial 1/7", "sandbox battery", 1, 7))
        progress("dropped: a plain message within the interval")
        progress(Step("trial 5/7", "sandbox battery", 5, 7))
        assert view.shown() == {"sandbox battery": 5}
    assert lines == []  # Steps move bars on a terminal; the dropped string stays dropped


# -- on a terminal: bars ----------------------------------------------------------------------------

def _live(width: int = 120) -> tuple[ProgressView, io.StringIO, list[str]]:
    out, lines = io.StringIO(), []
    return ProgressView(lines.append, live=True, console=Console(file=out, force_terminal=True, width=width)), out, lines


def test_bars_show_done_of_total_and_time_left_and_log_only_what_asks() -> None:
    view, out, lines = _live()
    with view:
        view(Step("trial 3/7 (float32 tokens=3)", "sandbox battery", 3, 7, detail="float32 tokens=3"))
        view(Step("timing round 2/5 (40 s left)", "sandbox timing", 2, 5, deadline=time.monotonic() + 40.4))
        assert view.shown() == {"sandbox battery": 3, "sandbox timing": 2}
        view(Step("  gate round 1/3: tokens/s before 10.0, after 11.0 (1.10x)", "gate rounds", 1, 3, log=True))
    text = out.getvalue()
    assert "sandbox battery" in text and "3/7" in text and "float32 tokens=3" in text
    assert "sandbox timing" in text and "2/5" in text and "40 s left" in text
    assert "gate rounds" in text and "1/3" in text
    assert "trial 3/7" not in text  # a Step's own text is not printed as a line on a terminal ...
    assert lines == ["  gate round 1/3: tokens/s before 10.0, after 11.0 (1.10x)"]  # ... unless it asks to be logged
    assert not view.takes_every_step and view.shown() == {}  # closed: the bars are gone


def test_a_plain_message_clears_the_bars_and_a_restarted_task_resets_its_bar() -> None:
    view, out, lines = _live()
    with view:
        view(Step("trial 6/7", "sandbox battery", 6, 7))
        view(Step("trial 2/7", "sandbox battery", 2, 7))  # the next candidate's battery
        assert view.shown() == {"sandbox battery": 2}
        assert "2/7" in out.getvalue()
        view("  cand_a: mismatch trial 2 ...")
        assert view.shown() == {}  # no stale bar under the next step's lines
    assert lines == ["  cand_a: mismatch trial 2 ..."]


def test_plain_output_goes_above_the_bars_through_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    out = io.StringIO()
    with ProgressView(live=True, console=Console(file=out, force_terminal=True, width=100)) as view:
        view(Step("1/4 requests done", "profile requests", 1, 4))
        view("starting the engine")  # the default emit: a line on sys.stderr, which the display proxies
    assert "starting the engine" in out.getvalue() and "1/4" in out.getvalue()
    assert "starting the engine" not in capsys.readouterr().err


def test_the_daemons_wrapper_still_takes_every_step() -> None:
    from kernelloop.agent.daemon import Daemon, DaemonMetrics

    view, _, lines = _live()
    with view:
        ctx = SimpleNamespace(progress=view)
        Daemon(ctx, None, interval_s=0, max_runs=1, max_seconds=None, metrics=DaemonMetrics())  # type: ignore[arg-type]
        assert takes_every_step(ctx.progress)
        ctx.progress(Step("trial 1/2", "sandbox battery", 1, 2))
        assert view.shown() == {"sandbox battery": 1} and lines == []
    plain = SimpleNamespace(progress=lines.append)
    Daemon(plain, None, interval_s=0, max_runs=1, max_seconds=None, metrics=DaemonMetrics())  # type: ignore[arg-type]
    assert not takes_every_step(plain.progress)


# -- the emitters -----------------------------------------------------------------------------------

def _steps(messages: list[str]) -> list[Step]:
    assert all(isinstance(m, Step) for m in messages), messages
    return messages  # type: ignore[return-value]


def test_sandbox_battery_steps_count_trials_against_the_correctness_deadline(tmp_path: Path) -> None:
    from kernelloop.kernels import get_op
    from kernelloop.sandbox import CheckOptions
    from kernelloop.sandbox.judge.candidate_run import CandidateRun
    from kernelloop.sandbox.judge.orchestrator import Sandbox
    from kernelloop.sandbox.verdict import Verdict

    spec = get_op("rmsnorm")
    shape = dict(spec.test_shapes[0])
    plan = {"trials": [{"shape": shape, "variant": {}, "dtype": "float32", "seed": i, "determinism": False}
                       for i in range(5)], "timing": None}
    child = SimpleNamespace(send_call=lambda args, config=None: None, start_replay=lambda record, inputs, order=None: None, isolation={})

    class Battery(Sandbox):  # the judge's loop, with fake children: the candidate fails its 3rd trial
        def __init__(self) -> None:
            self.options, self.compile_for, self.answered = CheckOptions(device="cpu", timing=False), (), 0
            self.progress, self.messages = self.messages_append, []
            self.run = CandidateRun(budget=SimpleNamespace(total_s=50.0), memory_mb=0, deadline=time.monotonic() + 50)

        def messages_append(self, message: str) -> None:
            self.messages.append(message)

        def spawn(self, *args, **kwargs):  # noqa: ANN002,ANN003,ANN202
            return child, {"type": "load", "ok": True, "error": None, "constants": {}, "violations": []}

        def _answer(self, v, spec, runner, where, args, expected, shape, compare=True):  # noqa: ANN001,ANN202
            self.answered += 1
            return None if self.answered == 3 else SimpleNamespace(record={}, inputs=[])

        def _replay_outcome(self, v, replayer, trial):  # noqa: ANN001,ANN202
            return trial

    sandbox = Battery()
    sandbox._judge(spec, "", "cand.py", plan, Verdict(op="rmsnorm", device="", file="", sha256=""), tmp_path, False)
    steps = _steps(sandbox.messages)
    assert [(s.task, s.done, s.total) for s in steps] == [("sandbox battery", i, 5) for i in (1, 2, 3)]
    assert steps[0].startswith("trial 1/5 (float32 ") and steps[0].detail in steps[0]
    assert all(s.deadline == sandbox.run.deadline for s in steps)


def test_sandbox_timing_steps_count_rounds_and_say_the_budget_left(tmp_path: Path) -> None:
    from kernelloop.kernels import get_op
    from kernelloop.sandbox.judge.timing import ABTimer
    from kernelloop.sandbox.verdict import Verdict

    spec = get_op("rmsnorm")
    messages: list[str] = []

    run = SimpleNamespace(budget=SimpleNamespace(total_s=180.0), deadline=time.monotonic() + 61, phase="")
    sandbox = SimpleNamespace(options=SimpleNamespace(device=CPU), progress=messages.append, run=run,
                              checked_call=lambda *args: 0.001)  # the candidate and the baseline, every call
    timer = ABTimer(sandbox)
    sides = {"baseline": (None, None), "candidate": (None, None)}

    timing = {"shape": dict(spec.test_shapes[0]), "dtype": "float32", "rounds": [[1], [2], [3], [4]]}
    rounds: list = []
    v = Verdict(op="rmsnorm", device="", file="", sha256="")
    assert timer.time_rounds(spec, timing, v, sides, "baseline", [[0]] + timing["rounds"], "timing", rounds)
    steps = _steps(messages)
    assert [(s.task, s.done, s.total) for s in steps] == [("sandbox timing", r, 4) for r in (1, 2, 3, 4)]
    assert steps[0].startswith("timing round 1/4 (") and "s of the 180 s budget left" in steps[0]
    assert all(s.deadline == run.deadline and 55 <= s.seconds_left() <= 61 for s in steps)
    assert len(rounds) == 4
    # confirmation rounds: no warm-up, counted on their own
    messages.clear()
    assert timer.time_rounds(spec, timing, v, sides, "baseline", [[5], [6]], "confirmation", rounds)
    assert [(s.task, s.done, s.total) for s in _steps(messages)] == [("sandbox confirmation", r, 2) for r in (1, 2)]
    assert len(rounds) == 6


def test_profile_over_http_counts_requests_done(monkeypatch: pytest.MonkeyPatch) -> None:
    from kernelloop.profiler import http
    from kernelloop.profiler.workload import agent_workload

    async def fake_stream(client, url, model, w, traffic):  # noqa: ANN001,ANN202
        traffic.ttft.append(0.01)
        await asyncio.sleep(0)
        return 0.001

    monkeypatch.setattr(http, "_stream_one", fake_stream)
    messages: list[str] = []
    traffic, reason = asyncio.run(http._drive(None, "http://x", "m", agent_workload(5, seed=0), 2, 30.0, 0.0, [],
                                              messages.append))
    steps = _steps(messages)
    assert traffic.done == 5 and reason == ""
    assert [(s.task, s.done, s.total) for s in steps] == [("profile requests", i, 5) for i in range(1, 6)]
    assert steps[-1] == "5/5 requests done" and 25 <= steps[-1].seconds_left() <= 30


def test_gate_rounds_are_logged_steps_with_their_old_text() -> None:
    from kernelloop.agent.gate import alternate_speed

    messages: list[str] = []
    speed = alternate_speed(lambda revision, warmup: 10.0 if revision == "a" else 11.0, "a", "b", 3, messages.append)
    steps = _steps(messages)
    assert [(s.task, s.done, s.total, s.log) for s in steps] == [("gate rounds", i, 3, True) for i in (1, 2, 3)]
    assert steps[1] == "  gate round 2/3: tokens/s before 10.0, after 11.0 (1.10x)"
    assert speed["ratio"] == pytest.approx(1.1)


def test_the_daemons_log_lines_go_above_the_bars(capsys: pytest.CaptureFixture[str]) -> None:
    import logging

    from kernelloop.agent.progress_view import StderrHandler

    log = logging.getLogger("kernelloop.test_progress")
    handler = StderrHandler()
    log.addHandler(handler)
    log.propagate = False
    try:
        out = io.StringIO()
        with ProgressView(log.warning, live=True, console=Console(file=out, force_terminal=True, width=100)) as view:
            view(Step("trial 1/2", "sandbox battery", 1, 2))
            view("checking cand_a")  # through the logger, whose handler finds the display's stderr
        log.warning("after the bars")  # the real stderr again
    finally:
        log.removeHandler(handler)
    assert "checking cand_a" in out.getvalue() and "after the bars" not in out.getvalue()
    err = capsys.readouterr().err
    assert "after the bars" in err and "checking cand_a" not in err
