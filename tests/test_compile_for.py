"""`agent check --compile-for sm90`: a correct candidate is also compiled for GPU targets on CPU.

The runner (the candidate's process) only describes its launches; a confined compiled-Triton process
that never ran candidate Python compiles them from the judge's copy of the source; the judge refuses
what does not compile, spills or exceeds shared memory, and descriptions that lie (sandbox/judge/compile_check.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from kernelloop.common.errors import KernelloopError
from kernelloop.kernels.device import CPU
from kernelloop.kernels.ops import get_op
from kernelloop.sandbox import wire
from kernelloop.sandbox.inside.compile_child import DescriptionError, decode
from kernelloop.sandbox.judge.compile_check import CompileCheck, compile_setup
from kernelloop.sandbox.judge.executables import ptxas
from kernelloop.sandbox.options import CheckOptions
from kernelloop.sandbox.verdict import Verdict

REPO = Path(__file__).resolve().parents[1]
CANDIDATES = REPO / "tests" / "sandbox_candidates"
SPEC = get_op("rmsnorm")

ROW_KERNEL = '''import torch
import triton
import triton.language as tl


@triton.jit
def _row_kernel(x_ptr, w_ptr, y_ptr, stride_x, stride_y, n_cols, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < n_cols
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    ms = tl.sum(x * x, axis=0) / n_cols
    ms = ms + 0.0  # EXTRA
    y = x * tl.rsqrt(ms + eps) * w
    tl.store(y_ptr + row * stride_y + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


def forward(x, weight, eps):
    n = x.shape[-1]
    x2 = x.reshape(-1, n)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    rows = x2.shape[0]
    y = torch.empty((rows, n), dtype=x.dtype, device=x.device)
    if rows > 0 and n > 0:
        _row_kernel[(rows,)](x2, weight, y, x2.stride(0), y.stride(0), n, eps, BLOCK=triton.next_power_of_2(n), WARPS)
    return y.view(x.shape)
'''

# One warp holds the whole row: at hidden=8192 (the op's largest engine shape) 512 values a thread spill.
SPILLS = ROW_KERNEL.replace("WARPS", "num_warps=1")
# `break` runs in the interpreter (the battery passes) but compiled Triton rejects it.
DOES_NOT_COMPILE = ROW_KERNEL.replace("WARPS", "num_warps=4").replace(
    "    ms = ms + 0.0  # EXTRA\n", "    for i in range(2):\n        if i == 1:\n            break\n        ms = ms + 0.0\n")
# Described on meta inputs as eight warps, really launched with one.
LIES_ABOUT_WARPS = ROW_KERNEL.replace("WARPS", "num_warps=8 if x.is_meta else 1")
# Describes a kernel the judge's copy of the source does not define at top level.
DESCRIBES_A_GHOST = ROW_KERNEL.replace("WARPS", "num_warps=4").replace("    return y.view(x.shape)\n", '''\
    if x.is_meta:  # a kernel made inside forward: no module-level code makes it, so nothing rebuilds it

        def _ghost_body(y_ptr, BLOCK: tl.constexpr):
            tl.store(y_ptr + tl.arange(0, BLOCK), tl.zeros([BLOCK], dtype=tl.float32))

        triton.jit(_ghost_body)[(1,)](y, BLOCK=16)
    return y.view(x.shape)
''')

needs_ptxas = pytest.mark.skipif(ptxas() is None, reason="this triton build has no bundled ptxas")


# -- the judge's side, on forged answers (no processes) -------------------------------------------

class FakeChild:
    """Answers the judge's messages with what a test scripts, as a compromised process could."""

    def __init__(self, *answers: dict[str, Any]) -> None:
        self.answers, self.sent = list(answers), []

    def send(self, header: dict[str, Any], tensors: list = ()) -> None:
        self.sent.append(header)

    def expect(self, kind: str, max_bytes: int = 1 << 20) -> dict[str, Any]:
        answer = self.answers.pop(0)
        assert answer["type"] == kind
        return answer


LAUNCH = {"kernel": "_k", "args": [{"ptr": 0, "byte_offset": 0, "dtype": "float32"}, 7], "kwargs": {"BLOCK": 64}}


def _result(**over: Any) -> dict[str, Any]:
    return {"kernel": "_k", "registers": 40, "spill_bytes": 0, "stack_bytes": 0, "shared_bytes": 0, "num_warps": 4,
            "num_stages": 3, "constexprs": {"BLOCK": 64}, "seconds": 0.5, "error": None, **over}


def _judge(captured: dict[str, Any], compiled: dict[str, Any] | None = None) -> Verdict:
    plan = {"trials": [{"shape": dict(SPEC.test_shapes[0]), "variant": {}, "dtype": "float32"}]}
    check = CompileCheck(SPEC, ("sm90",), plan)
    check.note({"shape": check.test_shape, "variant": {}, "dtype": "float32"},
               {"entries": [{"kind": "launch", "grid": [1, 1, 1], **LAUNCH}]})
    v = Verdict(op="rmsnorm", device="cpu-interpreter", file="c.py", sha256="0")
    compiler = FakeChild({"type": "load", "ok": True}, *([compiled] if compiled else []))
    check.run(v, FakeChild({"type": "captured", "violations": [], **captured}),
              lambda: (compiler, compiler.expect("load")))
    return v


def _captured(*launches: list) -> dict[str, Any]:
    return {"shapes": [{"launches": l, "error": None} for l in launches]}


IDENT = json.dumps(["_k", [["BLOCK", "64"]], [["num_warps", 4]]])


def test_a_spill_reported_by_the_compile_process_is_a_refusal_with_the_numbers() -> None:
    compiled = {"type": "compiled", "launches": [{"compiled": 0, "ident": IDENT, "error": None}] * 3,
                "results": [{"sm90": _result(spill_bytes=672, registers=255)}]}
    v = _judge(_captured([LAUNCH], [LAUNCH]), compiled)
    assert v.failure == "compile-target" and not v.accepted, v.reason
    assert v.reason.startswith("sm90: kernel _k spills 672 bytes"), v.reason
    assert v.compile["sm90"][0]["registers"] == 255 and v.compile["sm90"][0]["labels"]
    fine = {**compiled, "results": [{"sm90": _result()}]}
    assert _judge(_captured([LAUNCH], [LAUNCH]), fine).failure is None


@pytest.mark.parametrize("captured, reason", [
    ({"shapes": [{"launches": [], "error": "RuntimeError: Cannot access data pointer of Tensor"}] * 2},
     "forward raised on meta inputs"),
    (_captured([], [LAUNCH]), "described 0 launches"),
    (_captured([LAUNCH] * 17, [LAUNCH]), "described 17 launches"),
    (_captured("not a list", [LAUNCH]), "described no launches"),
])
def test_a_capture_answer_that_describes_nothing_usable_is_refused(captured: dict, reason: str) -> None:
    v = _judge(captured)
    assert v.failure == "compile-target" and reason in v.reason, v.reason


def test_a_capture_answer_of_the_wrong_form_is_a_protocol_error_and_a_violation_is_a_violation() -> None:
    for forged in ({"shapes": [{"launches": [LAUNCH], "error": None}]}, {"shapes": "x"}, {"shapes": [1, 2]}):
        with pytest.raises(wire.ProtocolError):
            _judge(forged)
    v = _judge({**_captured([LAUNCH], [LAUNCH]), "violations": ["open('/etc/passwd') is not allowed"]})
    assert v.failure == "sandbox-violation"


def test_described_launches_must_be_the_ones_made_at_the_test_shape() -> None:
    other = json.dumps(["_k", [["BLOCK", "64"]], [["num_warps", 8]]])
    compiled = {"type": "compiled", "launches": [{"compiled": 0, "ident": other, "error": None},
                                                 {"compiled": 1, "ident": IDENT, "error": None},
                                                 {"compiled": 0, "ident": other, "error": None}],
                "results": [{"sm90": _result(num_warps=8)}, {"sm90": _result()}]}
    v = _judge(_captured([LAUNCH], [LAUNCH]), compiled)
    assert v.failure == "compile-target" and "not the ones it made" in v.reason, v.reason
    assert "num_warps=8" in v.reason and "num_warps=4" in v.reason


def test_a_description_the_compile_process_could_not_use_is_refused_and_garbage_is_an_error() -> None:
    bad = {"compiled": None, "ident": None, "error": "kernel '_ghost' is not a top-level @triton.jit function"}
    compiled = {"type": "compiled", "launches": [bad] + [{"compiled": 0, "ident": IDENT, "error": None}] * 2,
                "results": [{"sm90": _result()}]}
    v = _judge(_captured([LAUNCH], [LAUNCH]), compiled)
    assert v.failure == "compile-target" and "'_ghost' is not a top-level" in v.reason, v.reason
    for results in ([{"sm90": _result(registers="many")}], [{"sm80": _result()}], ["x"]):
        with pytest.raises(wire.ProtocolError):
            _judge(_captured([LAUNCH], [LAUNCH]), {**compiled, "results": results})


def _kernel(*params: tuple[str, bool, bool]) -> Any:
    return SimpleNamespace(params=[SimpleNamespace(name=n, is_constexpr=c, has_default=d) for n, c, d in params],
                           fn=SimpleNamespace(__name__="_k"))


@pytest.mark.parametrize("description, message", [
    ({**LAUNCH, "kernel": "_ghost"}, "is not a top-level @triton.jit function"),
    ({**LAUNCH, "kernel": ["_k"]}, "is not a top-level"),
    ({**LAUNCH, "kwargs": {"BLOCK": 64, "num_warps": 3}}, "num_warps=3 is not a valid launch option"),
    ({**LAUNCH, "kwargs": {"BLOCK": 64, "num_warps": True}}, "not a valid launch option"),
    ({**LAUNCH, "kwargs": {"BLOCK": 64, "evil": 1}}, "unexpected keyword argument 'evil'"),
    ({**LAUNCH, "kwargs": {"BLOCK": 64, "n": 1}}, "unexpected keyword argument 'n'"),  # given twice
    ({**LAUNCH, "kwargs": {}}, "missing argument 'BLOCK'"),
    ({**LAUNCH, "args": LAUNCH["args"] * 3}, "6 arguments for 3 parameters"),
    ({**LAUNCH, "args": [{"ptr": 0, "byte_offset": 2, "dtype": "float32"}, 7]}, "malformed pointer"),
    ({**LAUNCH, "args": [{"ptr": 0, "byte_offset": 0, "dtype": "object"}, 7]}, "malformed pointer"),
    ({**LAUNCH, "args": [{"seq": [{"seq": [{"seq": [{"seq": [{"seq": [1]}]}]}]}]}, 7]}, "not a launch argument"),
    ({**LAUNCH, "args": [{"tensor": 1}, 7]}, "not a launch argument"),
    ({**LAUNCH, "args": [0, 1 << 70]}, "64-bit range"),
    ("launch", "must be an object"),
])
def test_forged_launch_descriptions_are_refused(description: Any, message: str) -> None:
    table = {"_k": _kernel(("x_ptr", False, False), ("n", False, False), ("BLOCK", True, False))}
    with pytest.raises(DescriptionError, match=message):
        decode(table, description)
    launch = decode(table, LAUNCH)
    assert launch.args[0].is_meta and launch.args[1] == 7 and launch.kwargs == {"BLOCK": 64}


def test_targets_are_checked_before_anything_starts() -> None:
    assert compile_setup((), CPU, True, None) == ((), None, ())
    with pytest.raises(KernelloopError, match="unknown GPU target sm91"):
        compile_setup(("sm90", "sm91"), CPU, True, None)


def test_the_cli_flag_with_a_bad_target_is_one_line_and_exit_2(tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "TRITON_INTERPRET": "1"}
    result = subprocess.run([sys.executable, "-m", "kernelloop.agent.cli", "check", "rmsnorm",
                             str(CANDIDATES / "control_rmsnorm_row.py"), "--compile-for", "sm90,sm91"],
                            cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and result.stdout == "", result.stderr
    assert result.stderr.strip() == ("agent check: --compile-for: unknown GPU target sm91 "
                                     "(known: sm80, sm86, sm89, sm90, sm100, sm120)")


# -- whole candidates through the sandbox -----------------------------------------------------------

@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory):
    from kernelloop.sandbox import Sandbox

    options = CheckOptions(registry=tmp_path_factory.mktemp("reg"), timing=False, seed=5, dtypes=("float32",),
                           compile_for=("sm90",))
    with Sandbox(options) as box:
        yield box


@pytest.mark.slow
@needs_ptxas
def test_an_honest_candidate_passes_with_its_compile_results(sandbox) -> None:  # noqa: ANN001
    v = sandbox.judge_source("rmsnorm", (CANDIDATES / "control_rmsnorm_row.py").read_text(), "row.py")
    assert v.correct and v.failure is None, v.reason
    results = v.to_json()["compile"]["sm90"]
    assert results and all(r["kernel"] == "_row_kernel" and 0 < r["registers"] <= 255 for r in results), results
    assert all(r["spill_bytes"] == 0 and r["error"] is None for r in results)
    blocks = {r["constexprs"]["BLOCK"] for r in results}
    assert blocks == {4096, 8192}  # the largest test shape (hidden=2880) and the largest engine shape
    assert any(label.endswith("(launched)") for r in results for label in r["labels"])
    json.loads(v.json_line())


@pytest.mark.slow
@needs_ptxas
@pytest.mark.parametrize("source, reason", [
    (SPILLS, "sm90: kernel _row_kernel spills"),
    (DOES_NOT_COMPILE, "sm90: kernel _row_kernel does not compile for sm90: unsupported AST node type: Break"),
    (LIES_ABOUT_WARPS, "the launches it described on meta inputs (_row_kernel(BLOCK=4096, num_warps=8)) are not "
                       "the ones it made (_row_kernel(BLOCK=4096, num_warps=1))"),
    (DESCRIBES_A_GHOST, "'_ghost_body' is not a top-level @triton.jit function"),
], ids=["spills", "does-not-compile", "lies-about-warps", "describes-a-ghost"])
def test_correct_candidates_that_would_fail_on_the_gpu_are_refused(sandbox, source: str, reason: str) -> None:  # noqa: ANN001
    v = sandbox.judge_source("rmsnorm", source, "candidate.py")
    assert v.failure == "compile-target" and not v.correct and not v.accepted, (v.failure, v.reason)
    assert reason in v.reason, v.reason
    assert len(v.checks) > 10  # the whole CPU battery ran (and passed) first
