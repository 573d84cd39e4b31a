"""`@triton.autotune` on the CPU interpreter (kernels/interpreter_autotune.py).

Several configs run without a GPU benchmarker; the choice is the config with the fewest programs
(ties to the earlier), the same in every process; key, `prune_configs_by`, `reset_to_zero`,
`restore_value`, hooks and `@triton.heuristics` behave as Triton's own Autotuner makes them behave on
a GPU; the sandbox's pin goes round every config left after pruning. The sandbox side (the judge pins a
slot per trial) is shown by tests/sandbox_candidates/ea_autotune_*.py (planted: wrong in a config the
CPU would not pick) and control_autotune_flaggems_silu_mul.py in tests/test_sandbox_adversarial.py.

Costs: about 3 s (a few tiny interpreted launches each).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
import torch
import triton
import triton.language as tl

from kernelloop.kernels import OPS, interpreter_autotune
from kernelloop.kernels.compare import check_impl
from kernelloop.kernels.device import triton_interpreted

pytestmark = [
    pytest.mark.skipif(not triton_interpreted(), reason="checks Triton's CPU interpreter"),
    pytest.mark.skipif(os.environ.get("KERNELLOOP_INTERPRETER_FIDELITY") == "0", reason="interpreter patches off"),
]
CANDIDATES = Path(__file__).parent / "sandbox_candidates"


@pytest.fixture(autouse=True)
def unpinned():
    interpreter_autotune.pin(None)
    yield
    interpreter_autotune.pin(None)


def blocks(*sizes: int, **config) -> list[triton.Config]:
    return [triton.Config({"BLOCK": b}, **config) for b in sizes]


def doubler(configs: list[triton.Config], **autotune):
    """y = 2 x over `n` elements, BLOCK elements per program, autotuned over `configs`."""
    @triton.autotune(configs=configs, key=["n"], **autotune)
    @triton.jit
    def kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 2, mask=offs < n)
    return kernel


def run(kernel, x: torch.Tensor, y: torch.Tensor) -> dict:
    kernel[lambda meta: (triton.cdiv(meta["n"], meta["BLOCK"]),)](x, y, x.numel())
    return kernel.best_config.kwargs


def test_several_configs_run_and_the_fewest_programs_win() -> None:
    kernel, x = doubler(blocks(16, 64, 32)), torch.randn(100)
    y = torch.empty_like(x)
    assert run(kernel, x, y) == {"BLOCK": 64}
    assert torch.equal(y, 2 * x)
    assert {c.kwargs["BLOCK"]: t[0] for c, t in kernel.configs_timings.items()} == {16: 7.0, 64: 2.0, 32: 4.0}


def test_a_tie_goes_to_the_earlier_config_in_every_instance() -> None:
    for _ in range(2):  # a fresh autotuner (a new process) chooses the same
        @triton.autotune(configs=blocks(128, 256, 64), key=["n"])
        @triton.jit
        def per_row(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
            offs = tl.arange(0, BLOCK)
            row = tl.program_id(0)
            tl.store(y_ptr + row * n + offs, tl.load(x_ptr + row * n + offs, mask=offs < n) + 1, mask=offs < n)

        x = torch.randn(3, 50)
        y = torch.empty_like(x)
        per_row[(3,)](x, y, 50)  # the grid does not depend on the config: every config launches 3 programs
        assert per_row.best_config.kwargs == {"BLOCK": 128} and torch.equal(y, x + 1)


def test_no_timing_ever_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    from triton.runtime.autotuner import Autotuner

    def no_benchmarker(self):  # noqa: ANN001, ANN202
        raise AssertionError("the GPU driver's benchmarker was asked for")

    monkeypatch.setattr(Autotuner, "do_bench", property(no_benchmarker))
    timed: list = []
    kernel = doubler(blocks(16, 32), do_bench=lambda fn, quantiles: timed.append(fn) or [1.0, 1.0, 1.0])
    x = torch.randn(40)
    y = torch.empty_like(x)
    assert run(kernel, x, y) == {"BLOCK": 32} and timed == []  # not even a user's do_bench: nothing is timed
    assert not kernel.cache_results  # and Triton keeps no autotune disk cache while interpreting


def test_each_key_and_dtype_is_tuned_once() -> None:
    kernel = doubler(blocks(16, 64))
    for n, dtype in ((100, torch.float32), (100, torch.float32), (10, torch.float32), (100, torch.float16)):
        x = torch.randn(n).to(dtype)
        y = torch.empty_like(x)
        run(kernel, x, y)
        assert torch.equal(y, 2 * x)
    assert sorted(kernel.cache, key=str) == sorted([(10, "torch.float32", "torch.float32"),
                                                    (100, "torch.float16", "torch.float16"),
                                                    (100, "torch.float32", "torch.float32")], key=str)


def test_prune_configs_by_decides_what_can_run() -> None:
    def drop_64(configs, named_args, **kwargs):  # noqa: ANN001, ANN202
        return [c for c in configs if c.kwargs["BLOCK"] != 64]

    kernel = doubler(blocks(16, 64, 32), prune_configs_by={"early_config_prune": drop_64})
    x = torch.randn(100)
    y = torch.empty_like(x)
    assert run(kernel, x, y) == {"BLOCK": 32}
    chosen = set()
    for slot in range(6):  # pinned, only the configs left after pruning ever run
        interpreter_autotune.pin(slot)
        chosen.add(run(kernel, x, y)["BLOCK"])
        assert torch.equal(y, 2 * x)
    assert chosen == {16, 32}
    # perf_model + top_k keep the model's best only: it runs although another config launches fewer programs
    modelled = doubler(blocks(16, 64, 32), prune_configs_by={"perf_model": lambda **m: m["BLOCK"], "top_k": 1})
    assert run(modelled, x, y) == {"BLOCK": 16}


def accumulator(**autotune):
    @triton.autotune(configs=blocks(16, 32), key=["n"], **autotune)
    @triton.jit
    def kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.atomic_add(out_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)
    return kernel


def test_reset_to_zero_and_restore_value_as_on_a_gpu() -> None:
    kernel, x = accumulator(reset_to_zero=["out_ptr"]), torch.randn(50)
    out = torch.full_like(x, 5.0)
    run(kernel, x, out)
    assert torch.equal(out, x)  # zeroed before the first launch of the key (while tuning)
    out = torch.full_like(x, 5.0)
    run(kernel, x, out)
    assert torch.equal(out, 5.0 + x)  # a cached key is not reset: a GPU does not either

    @triton.autotune(configs=blocks(16, 32), key=["n"], restore_value=["x_ptr"])
    @triton.jit
    def in_place(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) + 1, mask=offs < n)

    x = torch.zeros(50)
    in_place[lambda meta: (triton.cdiv(50, meta["BLOCK"]),)](x, x, 50)
    assert torch.equal(x, torch.ones(50))  # updated exactly once


def test_hooks_run_where_triton_runs_them() -> None:
    calls: list = []
    configs = [triton.Config({"BLOCK": 16}, pre_hook=lambda named: calls.append(("config 16", named["n"]))),
               triton.Config({"BLOCK": 64}, pre_hook=lambda named: calls.append(("config 64", named["n"])))]
    kernel = doubler(configs, pre_hook=lambda named, reset_only=False: calls.append(("tuner", reset_only)))
    x = torch.randn(100)
    y = torch.empty_like(x)
    run(kernel, x, y)
    run(kernel, x, y)
    assert calls == [("tuner", True), ("config 64", 100), ("config 64", 100)] and torch.equal(y, 2 * x)


def test_heuristics_below_and_above_the_autotuner() -> None:
    @triton.heuristics({"SCALE": lambda args: 3})
    @triton.autotune(configs=[triton.Config({"BLOCK": 8}), triton.Config({"BLOCK": 4})], key=["n"])
    @triton.heuristics({"ROWS": lambda args: 2 if args["n"] % 2 == 0 else 1})
    @triton.jit
    def kernel(x_ptr, y_ptr, n, m, BLOCK: tl.constexpr, ROWS: tl.constexpr, SCALE: tl.constexpr):
        rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
        cols = tl.arange(0, BLOCK)
        mask = (rows[:, None] < n) & (cols[None, :] < m)
        offs = rows[:, None] * m + cols[None, :]
        tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask) * SCALE, mask=mask)

    x = torch.randn(6, 4)
    y = torch.empty_like(x)
    # the grid reads ROWS, set by the heuristic below the autotuner: the choice still sees the real grids
    kernel[lambda meta: (triton.cdiv(meta["n"], meta["ROWS"]) * (8 // meta["BLOCK"]),)](x, y, 6, 4)
    assert kernel.fn.best_config.kwargs == {"BLOCK": 8} and torch.equal(y, 3 * x)


def test_a_pin_goes_round_every_config_and_lets_go() -> None:
    kernel, x = doubler(blocks(16, 64, 32)), torch.randn(100)
    y = torch.empty_like(x)
    run(kernel, x, y)  # tuned by the policy first
    seen = []
    for slot in (7, 8, 9, 10):
        interpreter_autotune.pin(slot)
        seen.append(run(kernel, x, y)["BLOCK"])
        assert torch.equal(y, 2 * x)
    assert seen == [64, 32, 16, 64]  # slot mod 3
    interpreter_autotune.pin(None)
    assert run(kernel, x, y) == {"BLOCK": 64}  # the policy's choice again (timing, the engine)


def _load(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name, bad_slot", [("ea_autotune_tail_past_small_block", 1),
                                            ("ea_autotune_grid_assumes_two_rows", 3)])
def test_planted_kernels_are_right_in_the_cpu_choice_and_wrong_in_another(name: str, bad_slot: int) -> None:
    forward = _load(CANDIDATES / f"{name}.py").forward
    shape = {"tokens": 4, "hidden": 1536}
    assert check_impl(OPS["rmsnorm"], forward, shape, torch.float32, seed=0).ok  # what the CPU would serve
    interpreter_autotune.pin(bad_slot)
    # other inputs than the first call's: rows the bad config never writes could otherwise reuse that call's freed
    # output, right by accident
    assert not check_impl(OPS["rmsnorm"], forward, shape, torch.float32, seed=1).ok


def test_the_flaggems_style_control_is_right_in_every_config() -> None:
    forward = _load(CANDIDATES / "control_autotune_flaggems_silu_mul.py").forward
    for slot in (None, 0, 1, 2, 3):
        interpreter_autotune.pin(slot)
        assert check_impl(OPS["silu_mul"], forward, {"tokens": 3, "d": 512}, torch.bfloat16, seed=1).ok, slot
