"""The judge as Ray actors (sandbox/cluster), on loopback clusters the tests start.

- CheckOptions / Verdict JSON round trips; an unreachable address is one line, quickly.
- 6 rmsnorm candidates (correct, wrong, mutating, raising, static-refused, slow) through 2 actors get
  the local judge's verdicts; a timed job gets a speedup, timed against the registry's choice sent
  as data (the worker has no registry path); a judge that cannot judge raises one line.
- kill -9 of an actor mid-check: still 6 verdicts, the killed job retried once, the actor replaced,
  nothing of the killed actor left; a job whose judge is killed twice is a `crash`.
- two node processes (`ray start --head` + `ray start --address`): judges on both.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from kernelloop.kernels.device import CPU
from kernelloop.sandbox.cluster import ClusterJob, ClusterUnavailable  # noqa: E402
from kernelloop.sandbox.options import CheckOptions  # noqa: E402
from kernelloop.sandbox.verdict import Check, Verdict  # noqa: E402

from tests.cluster_util import one_node, two_nodes  # noqa: E402
from tests.test_sandbox_faults import alive, descendants  # noqa: E402

CANDIDATES = Path(__file__).resolve().parent / "sandbox_candidates"
FAST = CheckOptions(device="cpu", timing=False, dtypes=("float32",), seed=7, batch_invariance=False, timeout_s=90)
SLOW = CheckOptions(device="cpu", timing=False, dtypes=("float32",), seed=7, batch_invariance=False, timeout_s=10)
RAISES = '''import torch
import triton
import triton.language as tl


@triton.jit
def _k(x_ptr):
    pass


def forward(x, weight, eps):
    raise ValueError("this candidate always raises")
'''


def _job(name: str, options: CheckOptions = FAST) -> ClusterJob:
    return ClusterJob("rmsnorm", (CANDIDATES / name).read_text(), name, options)


def six_jobs() -> list[ClusterJob]:
    """Slow first: with 2 actors it lands on actor 0 (the kill test's target)."""
    return [_job("infinite_loop.py", SLOW), _job("control_rmsnorm_row.py"), _job("c4_hardcoded_eps.py"),
            _job("mutates_input.py"), ClusterJob("rmsnorm", RAISES, "raises.py", FAST), _job("early_exit.py")]


def test_options_and_verdict_json_round_trip(tmp_path: Path) -> None:
    options = CheckOptions(device="cpu", registry=tmp_path / "reg", dtypes=("float32", "bfloat16"),
                           shapes=({"tokens": 3, "hidden": 64},), timing_shape={"tokens": 8, "hidden": 128},
                           compile_for=("sm90",), seed=3, baseline=("def forward(): pass\n", "e1"),
                           confirm=False)
    import json

    data = json.loads(json.dumps(options.to_json()))
    assert CheckOptions.from_json(data) == options
    assert CheckOptions.from_json(CheckOptions().to_json()) == CheckOptions()
    with pytest.raises(ValueError, match="unknown check options: bogus"):
        CheckOptions.from_json({"bogus": 1})
    v = Verdict(op="rmsnorm", device="cpu-interpreter", file="a.py", sha256="ab", checks=[Check("t", True, "d")],
                speedup_interval=[1.0, 2.0], judged_by={"actor": 1, "node": "127.0.0.1", "node_id": "n", "pid": 2,
                                                       "device": "cpu-interpreter", "retried": True})
    v.fail("mismatch", "wrong")
    back = Verdict.from_json(json.loads(v.json_line()))
    assert back == v and isinstance(back.checks[0], Check)


def test_unreachable_cluster_is_one_line_quickly() -> None:
    from kernelloop.sandbox.cluster import connect

    if ray.is_initialized():
        pytest.skip("this process is already connected to a Ray cluster")
    start = time.monotonic()
    with pytest.raises(ClusterUnavailable) as info:
        connect("127.0.0.1:1")
    assert time.monotonic() - start < 20
    message = str(info.value)
    assert "\n" not in message and message.startswith("cannot reach the Ray cluster at 127.0.0.1:1")


def _local(jobs: list[ClusterJob]) -> list[Verdict]:
    from kernelloop.sandbox.judge.orchestrator import Sandbox
    from kernelloop.sandbox.verdict import judge_or_refuse

    out = []
    for options in dict.fromkeys(j.options for j in jobs):
        with Sandbox(options) as sandbox:
            out += [(jobs.index(j), judge_or_refuse(sandbox, j.op, j.source, j.label)) for j in jobs if j.options == options]
    return [v for _, v in sorted(out, key=lambda p: p[0])]


def _kill_when_spinning(pool, kills: int, killed: list[dict], only: int | None = None) -> threading.Thread:  # noqa: ANN001
    """A thread that SIGKILLs, `kills` times, an actor (index `only`, else any) whose sandboxed process
    (two below it) has run for 2 s, recording the actor's descendants (with start times) just before."""
    def run() -> None:
        deadline = time.monotonic() + 200
        while len(killed) < kills and time.monotonic() < deadline:
            for info in pool.actors():
                if only is not None and info.index != only:
                    continue
                tree = descendants(info.pid)
                if any(depth >= 2 for depth, _ in tree.values()):
                    time.sleep(2.0)
                    tree = descendants(info.pid)
                    os.kill(info.pid, signal.SIGKILL)
                    killed.append({"index": info.index, "pid": info.pid, "tree": tree})
                    while any(i.pid == info.pid for i in pool.actors()):
                        time.sleep(0.2)  # until the pool has replaced it
                    break
            time.sleep(0.2)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _all_gone(tree: dict[int, tuple[int, int]], within_s: float = 5.0) -> list[int]:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        left = [pid for pid, (_, start) in tree.items() if alive(pid, start)]
        if not left:
            return []
        time.sleep(0.2)
    return left


@pytest.mark.slow
class TestOneNode:
    """One ray.init cluster (2 CPUs) and one 2-actor pool for the class."""

    @pytest.fixture(scope="class")
    @classmethod
    def pool(cls, tmp_path_factory):  # noqa: ANN001,ANN201
        from kernelloop.sandbox.cluster import JudgePool

        with one_node(tmp_path_factory.mktemp("ray-one")) as address:
            with JudgePool(address, device=CPU, workers=2) as pool:
                yield pool

    def test_two_actors_give_the_local_verdicts(self, pool) -> None:  # noqa: ANN001
        jobs = six_jobs()
        arrived: list[int] = []
        remote = pool.judge(jobs, on_verdict=lambda i, v: arrived.append(i))
        assert sorted(arrived) == list(range(6)) and len(remote) == 6
        local = _local(jobs)
        for job, r, v in zip(jobs, remote, local):
            assert (r.file, r.correct, r.accepted, r.failure, r.reason) == (v.file, v.correct, v.accepted, v.failure,
                                                                            v.reason), job.label
            assert v.judged_by is None and r.judged_by["node"] == "127.0.0.1" and not r.judged_by["retried"]
        assert [r.failure for r in remote] == ["timeout", None, "mismatch", "input-mutated", "raised", "static"]
        assert {r.judged_by["actor"] for r in remote} == {0, 1}
        stats = {a.index: a for a in pool.actors()}
        assert sum(a.checks for a in stats.values()) >= 6 and sum(a.failures for a in stats.values()) >= 5

    def test_timed_job_against_the_registry_choice_sent_as_data(self, pool, tmp_path: Path) -> None:  # noqa: ANN001
        from kernelloop.kernels.ops import get_op
        from kernelloop.kernels.registry import Registry
        from kernelloop.sandbox.judge.timing import planned_timing

        from tests.test_registry import add

        reg = Registry(tmp_path / "registry")
        options = CheckOptions(device="cpu", registry=reg.path, dtypes=("float32",), rounds=2, seed=7,
                               batch_invariance=False, timeout_s=150)
        shape, dtype = planned_timing(get_op("rmsnorm"), options)
        entry = add(reg, bucket=get_op("rmsnorm").bucket(shape), dtype=dtype, device="cpu-interpreter")
        v = pool.judge_one(_job("control_rmsnorm_row.py", options))
        assert v.correct and v.speedup is not None and v.judged_by["device"] == "cpu-interpreter", v.reason
        assert v.baseline == f"registry {entry.id}"

    def test_a_judge_that_cannot_judge_raises_one_line(self, pool) -> None:  # noqa: ANN001
        bad = CheckOptions(device="cpu", timing=False, dtypes=("float8",), seed=7)
        with pytest.raises(ClusterUnavailable, match=r"^judge \d on 127.0.0.1 cannot judge: UnknownDtypeError") as info:
            pool.judge([_job("control_rmsnorm_row.py", bad)])
        assert "\n" not in str(info.value)
        assert not any(a.busy for a in pool.actors())

    def test_kill_an_actor_mid_check(self, pool) -> None:  # noqa: ANN001
        killed: list[dict] = []
        thread = _kill_when_spinning(pool, 1, killed, only=0)
        verdicts = pool.judge(six_jobs())
        thread.join(5)
        assert len(verdicts) == 6 and len(killed) == 1
        assert [v.judged_by["retried"] for v in verdicts] == [True] + [False] * 5
        assert verdicts[0].failure == "timeout"
        assert pool.actors()[killed[0]["index"]].replaced >= 1 and pool.size == 2
        assert killed[0]["tree"] and _all_gone(killed[0]["tree"]) == []

    def test_a_job_whose_judge_dies_twice_is_a_crash(self, pool) -> None:  # noqa: ANN001
        killed: list[dict] = []
        thread = _kill_when_spinning(pool, 2, killed)
        v = pool.judge_one(_job("infinite_loop.py", SLOW))
        thread.join(5)
        assert len(killed) == 2
        assert v.failure == "crash" and "died twice" in v.reason and v.judged_by["retried"]
        assert all(_all_gone(k["tree"]) == [] for k in killed)


@pytest.mark.slow
def test_two_node_processes(tmp_path: Path) -> None:
    from kernelloop.sandbox.cluster import JudgePool

    from tests.ray_loopback import keep_loopback

    if ray.is_initialized():
        pytest.skip("this process is already connected to a Ray cluster")
    keep_loopback()
    with two_nodes(tmp_path) as address:
        try:
            with JudgePool(address, device=CPU, workers=2) as pool:
                assert len({a.node_id for a in pool.actors()}) == 2
                verdicts = pool.judge([_job("control_rmsnorm_row.py"), _job("c4_hardcoded_eps.py")])
                assert [v.failure for v in verdicts] == [None, "mismatch"]
                assert {v.judged_by["node"] for v in verdicts} == {"127.0.0.1"}
        finally:
            ray.shutdown()
