"""The sandbox on CUDA (run by bench/gpu_check.sh): confined processes with CUDA, replayed timing, exploits."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernelloop.sandbox import CheckOptions, Sandbox

pytestmark = pytest.mark.gpu
TESTS = Path(__file__).resolve().parent


def judge(op: str, path: Path, **kw) -> object:  # noqa: ANN003
    options = CheckOptions(device="cuda", registry=Path("/nonexistent-kernelloop-registry"), seed=11, rounds=5, **kw)
    with Sandbox(options) as sandbox:
        return sandbox.judge_source(op, path.read_text(), str(path))


def test_an_honest_variant_is_correct_on_cuda() -> None:
    v = judge("rmsnorm", TESTS / "sandbox_candidates" / "control_rmsnorm_multirow.py")
    assert v.correct, v.reason
    assert v.timing["modes"] and v.speedup is not None


def test_timing_is_the_replayers_cuda_events_and_confinement_holds() -> None:
    v = judge("rmsnorm", TESTS / "sandbox_candidates" / "control_rmsnorm_row.py", timing_shape={"tokens": 1, "hidden": 4096})
    assert v.correct, v.reason
    assert v.timing["modes"] == ["replay, cuda events after an L2 flush"]
    assert v.isolation.get("namespaces", "").startswith("user") and "seccomp" in v.isolation


def test_work_on_a_side_stream_is_not_accepted() -> None:
    v = judge("rmsnorm", TESTS / "sandbox_candidates_gpu" / "side_stream.py", static_check=False,
              timing_shape={"tokens": 1, "hidden": 4096})
    assert not v.accepted, v.reason


def test_torch_fallback_is_caught_on_cuda() -> None:
    v = judge("rmsnorm", TESTS / "sandbox_candidates" / "torch_fallback.py", timing=False)
    assert v.failure in ("torch-compute", "no-triton"), v.reason


def test_a_replay_beside_a_concurrent_load_keeps_an_honest_kernels_bits() -> None:
    import torch

    from kernelloop.kernels.ops import get_op
    from kernelloop.sandbox.inside.program_order import program_order

    spec = get_op("rmsnorm")
    args = spec.make_inputs({"tokens": 64, "hidden": 4096}, torch.bfloat16, 0, "cuda")
    alone = spec.forward(*args)
    with program_order(5, torch.device("cuda")):
        loaded = spec.forward(*args)
    torch.cuda.synchronize()
    assert torch.equal(alone.view(torch.int16), loaded.view(torch.int16))


def test_a_split_reduction_done_right_is_no_race_on_cuda() -> None:
    v = judge("rmsnorm", TESTS / "sandbox_candidates" / "control_rmsnorm_split_two_pass.py", timing=False,
              dtypes=("bfloat16",))
    assert v.correct, v.reason
