"""Compiling for a GPU target on CPU (kernels/target_compile.py): the numbers ptxas reports, the JIT's
specialisations, and the verdicts a compile gives (compiles, spills, does not compile)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kernelloop.common.errors import KernelloopError
from kernelloop.kernels.target_compile import CompileResult, parse_ptxas_log, parse_targets
from kernelloop.sandbox.judge.executables import ptxas

REPO = Path(__file__).resolve().parents[1]

PTXAS_LOG = """ptxas-blackwell info    : 11 bytes gmem
ptxas-blackwell info    : Compiling entry function '_rmsnorm_kernel' for 'sm_90a'
ptxas-blackwell info    : Function properties for _rmsnorm_kernel
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas-blackwell info    : Used 57 registers, used 1 barriers
"""


def test_the_ptxas_log_gives_registers_spills_and_stack() -> None:
    assert parse_ptxas_log(PTXAS_LOG) == (57, 0, 0)
    spilled = PTXAS_LOG.replace("0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads",
                                "1024 bytes stack frame, 512 bytes spill stores, 640 bytes spill loads")
    assert parse_ptxas_log(spilled) == (57, 1152, 1024)
    assert parse_ptxas_log("nothing here") == (None, None, None)


def test_a_result_names_its_problem() -> None:
    ok = CompileResult("k", "sm90", {}, 4, 3, registers=40, spill_bytes=0, shared_bytes=0)
    spills = CompileResult("k", "sm90", {}, 4, 3, registers=255, spill_bytes=96, shared_bytes=0)
    broken = CompileResult("k", "sm90", {}, 4, 3, error="out of resource: shared memory")
    assert ok.problem is None
    assert "spills 96 bytes" in spills.problem and "255 registers" in spills.problem
    assert "does not compile for sm90" in broken.problem


def test_targets_are_checked() -> None:
    assert parse_targets("sm90, sm80") == ("sm90", "sm80")
    with pytest.raises(KernelloopError, match="unknown GPU target sm91"):
        parse_targets("sm90,sm91")


_IN_COMPILED_TRITON = r'''
import json, torch, triton, triton.language as tl
from kernelloop.kernels.ops import get_op
from kernelloop.kernels.target_compile import capture_launches, compile_launch, meta_inputs, specialise
from triton.backends.compiler import GPUTarget
from triton.compiler.compiler import make_backend

out = {}
spec = get_op("rmsnorm")
with capture_launches() as launches:  # 8192 x 8192 bf16: meta tensors, nothing allocated or run
    y = spec.forward(*meta_inputs(spec, {"tokens": 8192, "hidden": 8192}, torch.bfloat16))
out["launches"] = [l.name for l in launches]
out["output_device"] = y.device.type
sig, constexprs, attrs, options = specialise(launches[0], make_backend(GPUTarget("cuda", 90, 32)))
out["signature"], out["constexprs"], out["options"] = sig, constexprs, options
out["divisible"] = sorted(i for (i,), a in attrs.items() if ["tt.divisibility", 16] in a)
r = compile_launch(launches[0], "sm90")
again = compile_launch(launches[0], "sm90")  # Triton's cache has it now: the numbers must not vanish
out["cached_registers"] = again.registers
out["rmsnorm"] = [r.registers, r.spill_bytes, r.shared_bytes, r.error]

@triton.jit
def _hoard(x_ptr, y_ptr, n, BLOCK: tl.constexpr):  # 16k values live in one warp (512 a thread): it spills
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    s = tl.sum(x * x, axis=0)
    tl.store(y_ptr + offs, x * s, mask=offs < n)

@triton.jit
def _square(a_ptr, c_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)  # BLOCK must be a power of 2
    a = tl.load(a_ptr + offs[:, None] * BLOCK + offs[None, :])
    tl.store(c_ptr + offs[:, None] * BLOCK + offs[None, :], tl.dot(a, a))

x = torch.empty(16384, device="meta")
with capture_launches() as launches:
    _hoard[(1,)](x, torch.empty_like(x), 16384, BLOCK=16384, num_warps=1)
    _square[(1,)](torch.empty(576, device="meta"), torch.empty(576, device="meta"), BLOCK=24)
    _square[(1,)](torch.empty(1 << 14, device="meta"), torch.empty(1 << 14, device="meta"), BLOCK=128)
    _hoard[(1,)](x, torch.empty_like(x), 1, BLOCK=16)  # n == 1: specialised to a constant, as the JIT does
hoard, bad, big = (compile_launch(launches[i], "sm90") for i in range(3))
out["hoard"] = [hoard.spill_bytes, hoard.problem]
out["bad"] = [bad.error, bad.problem]
out["big"] = [big.shared_bytes, compile_launch(launches[2], "sm86").problem]
out["n_is_one"] = specialise(launches[3], make_backend(GPUTarget("cuda", 90, 32)))[:2]

from kernelloop.agent.proposers.templates import rmsnorm as templates
from kernelloop.kernels.ops import get_op
from kernelloop.kernels.target_compile import source_problems
shapes = [{"tokens": 64, "hidden": 4096}]
out["template_spills"] = source_problems(templates.render({"template": "multirow", "rows": 4, "num_warps": 2}),
                                         get_op("rmsnorm"), shapes, torch.bfloat16, "sm90")
out["template_fits"] = source_problems(templates.render({"template": "row", "num_warps": 8}),
                                       get_op("rmsnorm"), shapes, torch.bfloat16, "sm90")
print(json.dumps(out, default=str))
'''


@pytest.mark.skipif(ptxas() is None, reason="this triton build has no bundled ptxas")
def test_compiles_spills_and_failures_for_sm90_on_cpu(tmp_path: Path) -> None:
    script = tmp_path / "compile_in_compiled_triton.py"  # @triton.jit needs its source in a file
    script.write_text(_IN_COMPILED_TRITON)
    env = {**os.environ, "TRITON_INTERPRET": "0", "PYTHONPATH": str(REPO), "TRITON_DEFAULT_FP_FUSION": "1"}
    proc = subprocess.run([sys.executable, str(script)], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["launches"] == ["_rmsnorm_kernel"] and out["output_device"] == "meta"
    assert out["signature"]["x_ptr"] == "*bf16" and out["signature"]["eps"] == "fp32"
    assert out["constexprs"] == {"BLOCK_N": 8192} and out["options"] == {"num_warps": 16}
    assert {0, 1, 2} <= set(out["divisible"])  # pointers (and 8192) carry the divisibility hint
    registers, spills, shared, error = out["rmsnorm"]
    assert error is None and 0 < registers <= 255 and spills == 0 and shared >= 0
    assert out["cached_registers"] == registers
    assert out["hoard"][0] > 0 and "spills" in out["hoard"][1]
    assert out["bad"][0] and "does not compile for sm90" in out["bad"][1]
    shared, on_sm86 = out["big"]  # two fp32 128x128 operands in shared memory: fine on sm90, not on sm86
    assert 101376 < shared <= 232448 and "shared memory; sm86 has 101376" in on_sm86, out["big"]
    signature, constexprs = out["n_is_one"]
    assert signature["n"] == "constexpr" and constexprs["n"] == 1
    # The search proposer's filter on a GPU: a template config that spills there is found before any run.
    assert out["template_spills"] and "spills" in out["template_spills"][0], out["template_spills"]
    assert out["template_fits"] == []


def test_compiling_needs_compiled_triton() -> None:
    """In this (interpreted) process the entry point refuses with one line instead of misbehaving."""
    from kernelloop.kernels.target_compile import capture_launches

    with pytest.raises(KernelloopError, match="TRITON_INTERPRET=0"):
        with capture_launches():
            pass
