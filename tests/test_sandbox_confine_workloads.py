"""sandbox.inside.confine: real work still runs once confined.

torch (matmul, threads), the Triton interpreter, and the key test: Triton's full CUDA pipeline
compiling a kernel to a cubin with the bundled ptxas inside the sandbox, no GPU needed. Probes run in a
confined child of tests/confine_harness.py's helper process.
"""

from __future__ import annotations

import pytest

from tests.confine_harness import _refused


def test_torch_after_confinement(helper, tmp_path):
    result, _ = helper.run("probe_torch", tmp_path, {})
    assert result["matmul"] == pytest.approx(result["expected"], rel=1e-4)
    assert result["threads"] == 2 and result["empty"] == [4, 5] and result["python_thread"] == [1000.0]


def test_triton_interpreter_after_confinement(helper, tmp_path):
    result, _ = helper.run("probe_triton_interpreter", tmp_path, {})
    assert result == {"ok": True, "kind": "InterpretedFunction"}


def test_compile_cubin_for_a_gpu_inside_the_sandbox(helper, tmp_path, ptxas):
    """The key test: Triton's full CUDA pipeline (MLIR, LLVM, the bundled ptxas) on a CPU machine, confined."""
    result, facts = helper.run("probe_compile_cubin", tmp_path, {"allow_exec": [ptxas]})
    assert result["cubin_type"] == "bytes" and result["cubin_len"] > 1000 and result["elf"], result
    assert result["name"] == "_add_kernel" and isinstance(result["shared"], int)
    assert result["n_regs"] and result["n_regs"] > 0 and result["n_spills"] == 0, result
    assert _refused(result["sh"]), result["sh"]
    assert result["tmp_left_in_scratch"] == []
    assert any((tmp_path / "triton-cache").rglob("*.cubin"))
    print(f"cubin {result['cubin_len']} bytes, {result['n_regs']} registers, {result['n_spills']} spills, "
          f"shared {result['shared']}; confine {facts['confine_ms']} ms")
