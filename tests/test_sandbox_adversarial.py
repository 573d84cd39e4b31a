"""Adversarial suite: every exploit in tests/sandbox_candidates/ must be caught, every control accepted.

Each candidate file says what the sandbox must answer, on a line like

    # expect: static=<code> runtime=<code>      (codes may list alternatives: a|b)
    # expect: control                           (must be judged correct, in every dtype)
    # expect: registry-payload                  (not a candidate: planted in a registry as the baseline)

`static=` is the verdict's failure with the static pre-check on; `runtime=` the failure with it
switched off, which proves the runtime guards hold by themselves. `# op: <name>` picks the op
(default rmsnorm); `# timing: on` judges the file with A/B timing (the clock-patching exploits);
`# memory-mb: N` gives it its own allowance (a hog that writes every page it takes must reach its limit
well within the deadline on a slow machine too); `# timeout-s: N` its own budget (an exploit that
misbehaves only on a late case of the battery, e.g. a fused-qkv variant of rope, must reach it).

All candidates of one (timing, control, static) group are judged by one Sandbox (one pre-warmed
fork server), once per module; each file is then its own test id. Exploits are judged in float32
only (their tricks do not depend on the dtype; the battery's variants all land in that one dtype
then), controls in every dtype with the static check on. The judge's environment holds a secret the exploits
hunt for. Afterwards the machine must be as it was: no canary files, HOME unchanged, the project
tree's `git status` unchanged, no `sleep 600` left running, and the secret in no verdict.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
CANDIDATES = Path(__file__).resolve().parent / "sandbox_candidates"
CANARY_FALLBACK = Path("/tmp/kernelloop-canary")
CANARY_GLOB = "kernelloop-canary*"  # every marker an exploit may leave is named like this
TIMEOUT_S = 10.0          # an exploit judged without timing: the endless and stalled ones end here
TIMED_TIMEOUT_S = 60.0    # with timing: honest-but-slow exploits get through the battery (1025 rows too) and the rounds
CONTROL_TIMEOUT_S = 300.0
MEMORY_MB = 3072
SEED = 1234
SECRET = "kernelloop-secret-7f3a"
pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]  # the module fixture judges every candidate twice

_EXPECT = re.compile(r"^# expect:\s*(.+?)\s*$", re.M)
_OP = re.compile(r"^# op:\s*(\w+)\s*$", re.M)
_TIMING = re.compile(r"^# timing:\s*on\s*$", re.M)
_MEMORY = re.compile(r"^# memory-mb:\s*(\d+)\s*$", re.M)
_BUDGET = re.compile(r"^# timeout-s:\s*(\d+)\s*$", re.M)


def _parse(path: Path) -> dict:
    text = path.read_text()
    m = _EXPECT.search(text)
    if not m:
        raise ValueError(f"{path.name}: no `# expect:` line")
    spec = m.group(1)
    entry = {"path": path, "name": path.stem, "op": (_OP.search(text) or [None, "rmsnorm"])[1],
             "timing": bool(_TIMING.search(text)), "control": spec == "control", "payload": spec == "registry-payload",
             "memory_mb": int((_MEMORY.search(text) or [None, MEMORY_MB])[1]),
             "timeout_s": float((_BUDGET.search(text) or [None, 0])[1]) or None}
    if not entry["control"] and not entry["payload"]:
        parts = dict(p.split("=", 1) for p in spec.split())
        if set(parts) != {"static", "runtime"}:
            raise ValueError(f"{path.name}: malformed expectation {spec!r}")
        entry["static"] = tuple(parts["static"].split("|"))
        entry["runtime"] = tuple(parts["runtime"].split("|"))
    return entry


ALL = [_parse(p) for p in sorted(CANDIDATES.glob("*.py"))]
CASES = [c for c in ALL if not c["payload"]]
PAYLOADS = [c for c in ALL if c["payload"]]
CASE_BY_NAME = {c["name"]: c for c in CASES}
NAMES = [c["name"] for c in CASES]
EXPLOITS = [c["name"] for c in CASES if not c["control"]]


def _git_status() -> str:
    return subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=REPO,
                          capture_output=True, text=True, check=True).stdout


def _listing(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def _sleep_600_pids() -> set[int]:
    pids = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if b"sleep 600" in cmdline.replace(b"\0", b" "):
            pids.add(int(proc.name))
    return pids


def _ipc_objects() -> set[str]:
    """System V shared memory segments and message queues (key, id) on the machine."""
    found = set()
    for kind in ("shm", "msg", "sem"):
        try:
            lines = Path(f"/proc/sysvipc/{kind}").read_text().splitlines()[1:]
        except OSError:
            continue
        found |= {f"{kind}:{' '.join(line.split()[:2])}" for line in lines}
    return found


def _canary_paths(canary_dir: Path) -> list[Path]:
    """Markers left by exploits: anything but the fallback directory itself, named kernelloop-canary*."""
    dirs = (canary_dir, CANARY_FALLBACK, Path("/tmp"), Path.home())
    return sorted({p for d in dirs if d.is_dir() for p in d.glob(CANARY_GLOB) if p != CANARY_FALLBACK})


@pytest.fixture(scope="module")
def machine(tmp_path_factory):
    """A private HOME and canary directory for the module, and the machine's state before judging."""
    home = tmp_path_factory.mktemp("home")
    (home / ".keep").write_text("unchanged\n")
    canary_dir = tmp_path_factory.mktemp("canary")
    cache = tmp_path_factory.mktemp("kernelloop-cache")  # the harness's own caches (bandwidth), not HOME
    for stale in _canary_paths(canary_dir):  # our own markers from an earlier, failed run
        if stale.is_dir() and not stale.is_symlink():
            shutil.rmtree(stale, ignore_errors=True)
        else:
            stale.unlink(missing_ok=True)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HOME", str(home))
        mp.setenv("KERNELLOOP_TEST_CANARY_DIR", str(canary_dir))
        mp.setenv("KERNELLOOP_CACHE", str(cache))
        mp.setenv("KERNELLOOP_TEST_SECRET", SECRET)
        before = {"git": _git_status(), "home": _listing(home), "sleep": _sleep_600_pids(), "ipc": _ipc_objects(),
                  "fallback_dir": CANARY_FALLBACK.exists()}
        state = {"home": home, "canary_dir": canary_dir, "before": before, "tmp": tmp_path_factory}
        yield state
    # Leave nothing running that a candidate started, whatever the assertions said.
    for pid in _sleep_600_pids() - before["sleep"]:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


@pytest.fixture(scope="module")
def judged(machine):
    """{(name, "static" | "runtime"): Verdict}: one sandbox (one fork server) per group, every op in it.

    Controls are judged in every dtype with the static check on (that run goes through every runtime
    layer too); exploits in float32 both ways, timed ones over 3 rounds."""
    from kernelloop.sandbox import CheckOptions, Sandbox

    registry = machine["tmp"].mktemp("registry")
    groups: dict[tuple, list[dict]] = {}
    for case in CASES:
        groups.setdefault((case["timing"], case["control"], case["memory_mb"], case["timeout_s"] or 0), []).append(case)
    results = {}
    for (timing, control, memory_mb, budget), cases in sorted(groups.items()):
        # Controls with the static check on only: it changes no code, so the runtime layers are the same.
        for mode, static in (("static", True),) if control else (("static", True), ("runtime", False)):
            opts = CheckOptions(device="cpu", registry=registry, timing=timing, static_check=static,
                                timeout_s=budget or (CONTROL_TIMEOUT_S if control else TIMED_TIMEOUT_S if timing
                                                     else TIMEOUT_S),
                                memory_mb=memory_mb, seed=SEED, dtypes=() if control else ("float32",),
                                rounds=None if control else 3)
            with Sandbox(opts) as sandbox:
                for case in cases:
                    source = case["path"].read_text()
                    results[(case["name"], mode)] = sandbox.judge_source(case["op"], source, str(case["path"]))
    return results


def _describe(v) -> str:
    d = v.to_json()
    keep = ("file", "correct", "accepted", "failure", "stage", "reason", "speedup", "log_tail")
    return json.dumps({k: d.get(k) for k in keep}, default=str)[:2000]


def _check(case: dict, v, mode: str) -> None:
    if case["control"]:
        assert v.correct is True, f"control judged incorrect ({mode}): {_describe(v)}"
        assert v.failure in (None, "not-faster"), f"control failed ({mode}): {_describe(v)}"
        return
    expected = case[mode]
    assert v.failure in expected, f"{mode}: expected failure in {expected}, got {_describe(v)}"
    assert v.accepted is False, f"{mode}: exploit accepted: {_describe(v)}"
    if v.failure != "not-faster":
        assert v.correct is False, f"{mode}: exploit judged correct: {_describe(v)}"
    json.dumps(v.to_json(), default=str)  # the verdict stays JSON-ready


def test_expectations_are_well_formed():
    from kernelloop.sandbox.verdict import FAILURES

    assert len(CASES) >= 27
    assert sum(c["control"] for c in CASES) >= 4
    for n in range(1, 9):  # at least one exploit per class (c<N>_*.py; docs/ARCHITECTURE.md's table)
        assert any(c["name"].startswith(f"c{n}_") for c in ALL), f"no exploit of class {n}"
    for case in CASES:
        for mode in ("static", "runtime"):
            for code in case.get(mode, ()):
                assert code in FAILURES, f"{case['name']}: unknown failure code {code!r}"


@pytest.mark.parametrize("name", NAMES)
def test_static_on(judged, name):
    _check(CASE_BY_NAME[name], judged[(name, "static")], "static")


@pytest.mark.parametrize("name", EXPLOITS)
def test_static_off_runtime_guards_hold(judged, name):
    _check(CASE_BY_NAME[name], judged[(name, "runtime")], "runtime")


def test_no_secret_in_any_verdict(judged):
    leaked = [name for (name, _), v in judged.items() if SECRET in json.dumps(v.to_json(), default=str)]
    assert not leaked, f"the judge's secret reached a verdict: {leaked}"


@pytest.mark.parametrize("payload", [c["name"] for c in PAYLOADS])
def test_registry_baseline_is_confined_too(machine, payload):
    """An entry planted in the registry is the timing baseline of an honest candidate: it runs under the
    same confinement (its escapes fail), and the candidate still gets a verdict."""
    from kernelloop.kernels.registry.entry import Provenance
    from kernelloop.kernels.registry.store import Registry
    from kernelloop.sandbox import CheckOptions, judge_files

    case = next(c for c in PAYLOADS if c["name"] == payload)
    registry = Registry(machine["tmp"].mktemp("planted") / "registry")
    shape = {"tokens": 4, "hidden": 96}
    spec_bucket = "hidden=96,tokens=2-16"
    registry.add("rmsnorm", case["path"].read_text(), device="cpu-interpreter", dtype="float32", bucket=spec_bucket,
                 speedup=9.0, speedup_ci=(8.0, 10.0), provenance=Provenance("search"))
    opts = CheckOptions(device="cpu", registry=registry.path, timing=True, timing_shape=shape, timing_dtype="float32",
                        dtypes=("float32",), rounds=3, timeout_s=CONTROL_TIMEOUT_S, seed=SEED)
    (v,) = judge_files("rmsnorm", [CANDIDATES / "control_rmsnorm_row.py"], opts)
    assert v.correct, _describe(v)
    assert v.failure in (None, "not-faster"), _describe(v)
    assert SECRET not in json.dumps(v.to_json(), default=str)
    leaked = [str(p) for p in _canary_paths(machine["canary_dir"])]
    assert not leaked and not (_sleep_600_pids() - machine["before"]["sleep"])


def test_machine_unchanged(judged, machine):
    """After every exploit ran (twice): no canary, HOME as it was, the tree as it was, no orphan."""
    before = machine["before"]
    leaked = [str(p) for p in _canary_paths(machine["canary_dir"])]
    assert not leaked, f"a candidate wrote outside its scratch directory: {leaked}"
    if not before["fallback_dir"]:
        assert not CANARY_FALLBACK.exists(), f"a candidate created {CANARY_FALLBACK}"
    assert _listing(machine["home"]) == before["home"], "HOME changed"
    assert _git_status() == before["git"], "the project tree changed"
    orphans = _sleep_600_pids() - before["sleep"]
    assert not orphans, f"`sleep 600` left running: pids {sorted(orphans)}"
    assert not _ipc_objects() - before["ipc"], "a candidate left System V IPC objects behind"


def test_cli_check_forged_verdict_is_not_believed(tmp_path):
    """The forger prints an accepted verdict line; the CLI's own last line must say otherwise."""
    forge = CANDIDATES / "forge_verdict.py"
    proc = subprocess.run(
        [sys.executable, "-m", "kernelloop.agent.cli", "check", "rmsnorm", str(forge), "--json", "--no-timing", "--no-history",
         "--registry", str(tmp_path / "registry")],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    last = proc.stdout.strip().splitlines()[-1]
    verdict = json.loads(last)
    if isinstance(verdict, list):  # one verdict per file
        assert len(verdict) == 1, last
        verdict = verdict[0]
    assert verdict["correct"] is False and verdict["accepted"] is False, last
