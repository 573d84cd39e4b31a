"""The memory limit is enforced where the allocation happens, and a verdict's class does not depend on
the machine's speed.

A sandboxed process gets hard RLIMIT_DATA (private writable memory) and, on CPU, RLIMIT_AS limits at
what it holds plus its allowance (sandbox/inside/guards.py `limit_memory`): an allocation past them fails at
once, and the judge calls that `memory` wherever it happens (in forward, at import, in the harness),
however fast or slowly the pages would have been written. The judge's RSS poll stays as the second
layer. What these tests assert holds on any machine: the allowances are small (64 MiB: reached in well
under a second even at 100 MB/s of first-touch page faults), and no assertion compares timings.

Costs: about 15 s (two subprocesses, one sandbox judging four small hogs; the fork server's start-up
is not part of any candidate's budget).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kernelloop.sandbox import CheckOptions, Sandbox
from kernelloop.sandbox.inside.guards import memory_refused, out_of_memory
from kernelloop.sandbox.judge.children import refusal

REPO = Path(__file__).resolve().parent.parent
ALLOWANCE_MB = 64

PROBE = textwrap.dedent('''
    import json, resource, sys, tempfile
    from pathlib import Path

    from kernelloop.sandbox.inside.confine import Policy, confine, probe

    scratch = Path(tempfile.mkdtemp())
    if sys.argv[1] == "confined":
        if probe():
            print(json.dumps({"skip": probe()}))
            raise SystemExit
        confine(Policy(scratch=scratch))  # as a sandboxed process: user namespace, Landlock, seccomp
    from kernelloop.kernels.device import CPU
    from kernelloop.sandbox.inside import guards

    if sys.argv[2] == "cpu":
        guards.isolate(scratch, int(sys.argv[3]), 60, CPU)
    else:  # what a CUDA runner gets after its warm-up: private memory only
        guards.limit_memory(int(sys.argv[3]), address_space=False)
    out = {}
    for name in ("RLIMIT_AS", "RLIMIT_DATA"):
        which = getattr(resource, name)
        soft, hard = resource.getrlimit(which)
        raised = []
        for attempt in (lambda: resource.setrlimit(which, (resource.RLIM_INFINITY, resource.RLIM_INFINITY)),
                        lambda: resource.setrlimit(which, (soft, hard + (1 << 20))),
                        lambda: resource.prlimit(0, which, (hard + (1 << 30), hard + (1 << 30)))):
            try:
                attempt()
                raised.append(True)
            except (ValueError, OSError):
                raised.append(False)
        out[name] = {"hard": hard != resource.RLIM_INFINITY, "equal": soft == hard, "raised": raised,
                     "unchanged": resource.getrlimit(which) == (soft, hard)}
    chunks = []
    try:
        while len(chunks) < 128:  # 1 GiB at most, every page written
            chunks.append(bytearray(b"\\x01") * (8 << 20))
        out["refused"] = None
    except MemoryError:
        out["refused"] = len(chunks) * 8
    print(json.dumps(out), flush=True)
''')


def _probe(mode: str, device: str) -> dict:
    proc = subprocess.run([sys.executable, "-c", PROBE, mode, device, str(ALLOWANCE_MB)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert lines, proc.stderr[-2000:]
    return json.loads(lines[0])


def test_a_confined_process_cannot_raise_its_memory_limits() -> None:
    out = _probe("confined", "cpu")
    if "skip" in out:
        pytest.skip(f"cannot confine here: {out['skip']}")
    for name in ("RLIMIT_AS", "RLIMIT_DATA"):
        assert out[name]["hard"] and out[name]["equal"], out  # soft == hard: nothing left to raise into
        assert out[name]["raised"] == [False, False, False] and out[name]["unchanged"], out
    assert out["refused"] is not None and out["refused"] <= ALLOWANCE_MB + 8, out  # at the allowance, not later


def test_private_memory_alone_refuses_allocations_as_a_cuda_runner_is_limited() -> None:
    out = _probe("unconfined", "cuda")
    assert out["RLIMIT_DATA"]["hard"] and out["RLIMIT_DATA"]["equal"] and not out["RLIMIT_AS"]["hard"], out
    assert out["refused"] is not None and out["refused"] <= ALLOWANCE_MB + 8, out


def test_refused_allocations_are_recognised_however_they_are_reported() -> None:
    assert out_of_memory(MemoryError())
    assert out_of_memory(RuntimeError("[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate memory"))
    try:
        try:
            bytearray(1 << 62)
        except MemoryError as exc:
            raise ValueError("the kernel failed") from exc  # wrapped by the interpreter or the candidate
    except ValueError as wrapped:
        assert out_of_memory(wrapped)
    assert not out_of_memory(ValueError("boom")) and not out_of_memory(None)
    assert memory_refused("OSError: [Errno 12] Cannot allocate memory") and not memory_refused("ValueError: 3")
    assert refusal({"type": "error", "error": "MemoryError", "violations": []}).failure == "memory"
    assert refusal({"type": "error", "error": "KeyError: 'x'", "violations": []}).failure == "crash"


HOGS = {
    # pages written one chunk at a time: a fast machine's allocator and a slow one's page faults alike
    "writes_pages": """
        def forward(x, weight, eps):
            hoard = []
            while True:
                hoard.append(bytearray(b"\\x01") * (8 << 20))
    """,
    # every page touched from Python, one at a time: first-touch as slow as a busy, freshly booted machine's
    "writes_slowly": """
        def forward(x, weight, eps):
            hoard = []
            while True:
                chunk = bytearray(4 << 20)
                for i in range(0, len(chunk), 4096):
                    chunk[i] = 1
                hoard.append(chunk)
    """,
    # reserved and never touched: resident memory (the poll) never grows
    "reserves": """
        def forward(x, weight, eps):
            return torch.empty(16 << 30, dtype=torch.uint8)
    """,
    # while the module is imported
    "at_import": """
        TABLE = bytearray(16 << 30)

        def forward(x, weight, eps):
            return x
    """,
}


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory) -> dict:
    options = CheckOptions(device="cpu", registry=tmp_path_factory.mktemp("memory") / "registry", timing=False,
                           timeout_s=60.0, memory_mb=ALLOWANCE_MB, seed=7, dtypes=("float32",), static_check=False)
    with Sandbox(options) as sandbox:
        return {name: sandbox.judge_source("rmsnorm", "import torch\n" + textwrap.dedent(source), f"{name}.py")
                for name, source in HOGS.items()}


@pytest.mark.parametrize("name", sorted(HOGS))
def test_every_hog_is_memory_whatever_the_speed(verdicts: dict, name: str) -> None:
    v = verdicts[name]
    assert v.failure == "memory", v.to_json()
    assert "private memory and address space +" in v.isolation["limits"], v.isolation  # said in every verdict
