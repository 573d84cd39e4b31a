"""Programs in a shuffled, seeded order under Triton's interpreter (kernels/interpreter_order.py)."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from kernelloop.kernels.interpreter_order import shuffled_programs


@triton.jit
def _arrival_kernel(counter_ptr, out_ptr, NY: tl.constexpr):
    ticket = tl.atomic_add(counter_ptr, 1)  # the how-manieth program to run
    pid = tl.program_id(0) * NY + tl.program_id(1)
    tl.store(out_ptr + pid, ticket)


def _arrivals(grid: tuple[int, int]) -> list[int]:
    counter = torch.zeros(1, dtype=torch.int32)
    out = torch.full((grid[0] * grid[1],), -1, dtype=torch.int32)
    _arrival_kernel[grid](counter, out, NY=grid[1])
    return out.tolist()


def test_grid_order_outside_and_a_seeded_permutation_inside() -> None:
    grid = (5, 3)
    assert _arrivals(grid) == list(range(15))
    with shuffled_programs(11):
        first, second = _arrivals(grid), _arrivals(grid)
    with shuffled_programs(11):
        again = _arrivals(grid)
    with shuffled_programs(12):
        other = _arrivals(grid)
    assert sorted(first) == list(range(15)) and first != list(range(15))  # every program ran, once
    assert first != second  # each launch its own order
    assert again == first and other != first  # the seed decides
    assert _arrivals(grid) == list(range(15))  # grid order again after the block


def test_the_interpreter_is_left_as_it_was_when_a_launch_raises() -> None:
    from triton.runtime.interpreter import interpreter_builder

    with pytest.raises(RuntimeError), shuffled_programs(3):
        _arrivals((4, 1))
        raise RuntimeError("boom")
    assert "set_grid_idx" not in vars(interpreter_builder) and "set_grid_dim" not in vars(interpreter_builder)
    assert _arrivals((4, 1)) == [0, 1, 2, 3]


def test_order_seeds_are_hashed_from_the_trial_seed() -> None:
    from kernelloop.sandbox.inside.program_order import ATOMIC_ORDERS, race_orders

    one, three = race_orders(12345, False), race_orders(12345, True)
    assert len(one) == 1 and len(three) == ATOMIC_ORDERS == len(set(three)) and three[0] == one[0]
    assert race_orders(12345, False) == one and race_orders(12346, False) != one  # seeded, not random
    assert all(0 <= s < 1 << 31 for s in three)
