"""agent/quantize/alternatives.py: what the KL-guided selection is compared against (a fake engine, no model)."""

from __future__ import annotations

import torch

from kernelloop.agent.quantize.alternatives import (
    alternatives,
    keep_first_last,
    num_layers,
    plan_bytes_saved,
    quantize_all,
    random_same_bytes,
)
from kernelloop.agent.quantize.measure import Calibration, Quality, Sensitivity
from kernelloop.agent.quantize.selection import Selection
from kernelloop.kernels.quant import SCHEMES

INT8, INT4 = SCHEMES["int8"], SCHEMES["int4"]
LAYERS = 4
# K = 96 has no int4 group (the o_proj), as a K that is not a multiple of 64 would be
SHAPES = {**{f"layers.{i}.{name}": shape for i in range(LAYERS)
             for name, shape in (("qkv_proj", (192, 64)), ("o_proj", (64, 96)), ("gate_up_proj", (256, 64)),
                                 ("down_proj", (64, 128)))},
          "lm_head": (100, 64)}


def sensitivities(itemsize: int = 4) -> list[Sensitivity]:
    return [Sensitivity(scope, s.name, 1e-3 * (i + 1), 1.0, n * k * itemsize, s.weight_bytes(n, k))
            for i, (scope, (n, k)) in enumerate(SHAPES.items()) for s in (INT8, INT4) if s.applies(k)]


class FakeEngine:
    """Each quantized scope shifts the log-distribution by a fixed amount: KL grows with the plan."""

    weight_itemsize = 4

    def __init__(self) -> None:
        self.plans: list[dict[str, str]] = []

    def projections(self) -> dict[str, tuple[int, int]]:
        return dict(SHAPES)

    def planned_logprobs(self, pairs, plan):
        self.plans.append(dict(plan))
        shift = sum(0.01 * (2 if name == "int4" else 1) for name in plan.values())
        logits = torch.zeros(len(pairs[0][1]), 8)
        logits[:, 0] = 1.0 + shift * torch.arange(len(pairs[0][1]))
        logits[:, 1] = 1.0
        return [torch.log_softmax(logits, dim=-1)]


def test_quantize_all_takes_every_scope_the_scheme_holds():
    assert quantize_all(SHAPES, INT8) == {scope: "int8" for scope in SHAPES}
    int4 = quantize_all(SHAPES, INT4)
    assert set(int4) == {s for s in SHAPES if not s.endswith("o_proj")} and set(int4.values()) == {"int4"}


def test_keep_first_last_keeps_the_edge_layers_and_lm_head():
    plan = keep_first_last(SHAPES, INT8, LAYERS)
    assert set(plan) == {f"layers.{i}.{n}" for i in (1, 2) for n in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")}
    assert "lm_head" not in plan and num_layers(SHAPES) == LAYERS
    assert "layers.1.o_proj" not in keep_first_last(SHAPES, INT4, LAYERS)  # int4 cannot hold K = 96
    bytes_all = plan_bytes_saved(SHAPES, quantize_all(SHAPES, INT8), 4)
    assert 0 < plan_bytes_saved(SHAPES, plan, 4) < bytes_all
    n, k = SHAPES["lm_head"]
    assert plan_bytes_saved(SHAPES, {"lm_head": "int8"}, 4) == n * k * 4 - (n * k + 4 * n)


def test_random_same_bytes_reaches_the_target_within_one_projection_and_is_seeded():
    sens = sensitivities()
    saved = {(s.scope, s.scheme): s.saved for s in sens}
    largest = max(saved.values())
    for target in (1, 20_000, 60_000, 150_000):
        for seed in range(6):
            plan = random_same_bytes(sens, target, seed)
            got = sum(saved[(scope, name)] for scope, name in plan.items())
            assert target <= got < target + largest, (target, seed, got)
            last = list(plan.items())[-1]
            assert got - saved[last] < target  # it stopped at the first that reached the target
            assert plan == random_same_bytes(sens, target, seed)  # deterministic per seed
    plans = {tuple(random_same_bytes(sens, 60_000, seed).items()) for seed in range(6)}
    assert len(plans) > 1  # seeds differ
    mixed = set().union(*(random_same_bytes(sens, 60_000, seed).values() for seed in range(6)))
    assert mixed == {"int8", "int4"}  # a random scheme per scope
    only = set().union(*(random_same_bytes(sens, 60_000, seed, {"int8"}).values() for seed in range(6)))
    assert only == {"int8"}
    everything = random_same_bytes(sens, 10**9, 0)  # out of reach: every scope, once
    assert set(everything) == set(SHAPES)
    assert random_same_bytes(sens, 0, 0) == {}


def test_alternatives_measures_every_row_on_the_calibration_given():
    engine = FakeEngine()
    cal = Calibration([([1, 2], [3, 4, 5, 6])], engine.planned_logprobs([([1, 2], [3, 4, 5, 6])], {}))
    sens = sensitivities()
    chosen = [s for s in sens if s.scope in ("layers.1.down_proj", "layers.2.gate_up_proj") and s.scheme == "int4"]
    selection = Selection(chosen, Quality(0.0, 1.0, 4), budget=0.1)
    progress: list[str] = []
    rows = alternatives(engine, cal, sens, selection, [INT8, INT4], seeds=(0, 1, 2), progress=progress.append)
    names = [r["name"] for r in rows]
    assert names == ["kl-guided", "all int8", "all int4", "first/last kept int8", "first/last kept int4",
                     "random (seed 0)", "random (seed 1)", "random (seed 2)",
                     "random, its schemes (seed 0)", "random, its schemes (seed 1)", "random, its schemes (seed 2)"]
    assert engine.plans[1:] == [selection.plan, quantize_all(SHAPES, INT8), quantize_all(SHAPES, INT4),
                                keep_first_last(SHAPES, INT8, LAYERS), keep_first_last(SHAPES, INT4, LAYERS),
                                *(random_same_bytes(sens, selection.bytes_saved, s) for s in (0, 1, 2)),
                                *(random_same_bytes(sens, selection.bytes_saved, s, {"int4"}) for s in (0, 1, 2))]
    by = {r["name"]: r for r in rows}
    assert by["kl-guided"]["bytes_saved"] == selection.bytes_saved and by["kl-guided"]["plan_size"] == 2
    assert by["all int8"]["plan_size"] == len(SHAPES) and by["all int4"]["plan_size"] == len(SHAPES) - LAYERS
    assert by["all int4"]["kl"] > by["all int8"]["kl"] > by["kl-guided"]["kl"] > 0  # measured, not copied
    assert all(0 <= r["agreement"] <= 1 for r in rows)
    largest = max(s.saved for s in sens)
    for seed in (0, 1, 2):
        for name in (f"random (seed {seed})", f"random, its schemes (seed {seed})"):
            row = by[name]
            assert 0 <= row["target_gap"] < largest and row["bytes_saved"] == selection.bytes_saved + row["target_gap"]
    assert set(engine.plans[-1].values()) == {"int4"}  # the selection used int4 alone: so do these rows
    assert len(progress) == len(rows)


def test_an_empty_selection_is_not_measured():
    engine = FakeEngine()
    cal = Calibration([([1], [2, 3])], engine.planned_logprobs([([1], [2, 3])], {}))
    rows = alternatives(engine, cal, sensitivities(), Selection([], Quality(0.0, 1.0, 2), 0.1), [INT8], seeds=(0,))
    assert rows[0] == {"name": "kl-guided", "plan_size": 0, "bytes_saved": 0, "kl": 0.0, "agreement": 1.0}
    assert rows[-1]["plan_size"] == 0 and len(engine.plans) == 1 + 2  # calibration, all int8, first/last
