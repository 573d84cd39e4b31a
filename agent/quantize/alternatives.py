"""What the KL-guided selection is compared against: other ways to choose what to quantize, measured alike.

- quantize everything a scheme can hold (`quantize_all`);
- the common heuristic: every layer but the first and the last, lm_head kept in full precision
  (`keep_first_last`);
- a random selection saving the same bytes as the KL-guided one (`random_same_bytes`, one per seed), with any
  scheme and with only the schemes the selection used (so a selection of int8 alone is not compared with
  random picks that are half int4).

`alternatives` measures each (and the selection itself) on one calibration, normally the held-out one, so
every row's KL and greedy agreement come from the same prompts and the same continuations.
"""

from __future__ import annotations

import random
import re
from typing import Any

from kernelloop.agent.quantize.measure import Calibration, Quality, QuantizableEngine, Sensitivity, quality
from kernelloop.agent.quantize.selection import Selection
from kernelloop.common.progress import Progress
from kernelloop.kernels.quant import Scheme, scheme

_LAYER = re.compile(r"layers\.(\d+)\.")


def quantize_all(shapes: dict[str, tuple[int, int]], scheme: Scheme) -> dict[str, str]:
    """Every projection `scheme` can hold (shapes: scope -> (N, K))."""
    return {scope: scheme.name for scope, (_, k) in shapes.items() if scheme.applies(k)}


def keep_first_last(shapes: dict[str, tuple[int, int]], scheme: Scheme, num_layers: int) -> dict[str, str]:
    """Every layer's projections in `scheme` except those of layer 0 and layer num_layers - 1; lm_head (and
    any other scope outside the layers) kept in full precision."""
    kept = {0, num_layers - 1}
    plan = {}
    for scope, (_, k) in shapes.items():
        m = _LAYER.match(scope)
        if m is not None and int(m.group(1)) not in kept and scheme.applies(k):
            plan[scope] = scheme.name
    return plan


def random_same_bytes(sens: list[Sensitivity], target_bytes: int, seed: int,
                      schemes: set[str] | None = None) -> dict[str, str]:
    """Random scopes, each with a random scheme measured for it (one of `schemes` when given), added until the
    bytes saved reach `target_bytes` (the first that reaches it is the last added, so it overshoots by less than
    one projection's saving); every scope when even that falls short. Deterministic per seed."""
    rng = random.Random(seed)
    options: dict[str, list[Sensitivity]] = {}
    for s in sens:
        if s.saved > 0 and (schemes is None or s.scheme in schemes):
            options.setdefault(s.scope, []).append(s)
    scopes = sorted(options)
    rng.shuffle(scopes)
    plan: dict[str, str] = {}
    saved = 0
    for scope in scopes:
        if saved >= target_bytes:
            break
        pick = rng.choice(sorted(options[scope], key=lambda s: s.scheme))
        plan[scope] = pick.scheme
        saved += pick.saved
    return plan


def plan_bytes_saved(shapes: dict[str, tuple[int, int]], plan: dict[str, str], itemsize: int) -> int:
    """Weight bytes a plan saves: each scope's full-precision bytes (`itemsize` per value) less its scheme's."""
    return sum(shapes[s][0] * shapes[s][1] * itemsize - scheme(name).weight_bytes(*shapes[s])
               for s, name in plan.items())


def num_layers(shapes: dict[str, tuple[int, int]]) -> int:
    """The number of layers the scopes name ("layers.{i}.*")."""
    return 1 + max((int(m.group(1)) for m in map(_LAYER.match, shapes) if m is not None), default=-1)


def alternatives(engine: QuantizableEngine, calibration: Calibration, sens: list[Sensitivity], selection: Selection,
                 schemes: list[Scheme], seeds: tuple[int, ...] = (0, 1, 2), *,
                 progress: Progress = lambda message: None) -> list[dict[str, Any]]:
    """Rows {"name", "plan_size", "bytes_saved", "kl", "agreement"} measured on `calibration`: "kl-guided"
    (the selection), "all <scheme>" and "first/last kept <scheme>" per scheme, "random (seed <s>)" per seed
    and "random, its schemes (seed <s>)" per seed when the selection used fewer schemes than offered (these also
carry "target_gap": their bytes saved less the selection's)."""
    shapes = engine.projections()
    target = plan_bytes_saved(shapes, selection.plan, engine.weight_itemsize)
    layers = num_layers(shapes)
    plans: list[tuple[str, dict[str, str]]] = [("kl-guided", selection.plan)]
    plans += [(f"all {s.name}", quantize_all(shapes, s)) for s in schemes]
    plans += [(f"first/last kept {s.name}", keep_first_last(shapes, s, layers)) for s in schemes]
    plans += [(f"random (seed {seed})", random_same_bytes(sens, target, seed)) for seed in seeds]
    used = set(selection.plan.values())
    if used and used != {s.name for s in schemes}:
        plans += [(f"random, its schemes (seed {seed})", random_same_bytes(sens, target, seed, used))
                  for seed in seeds]
    rows: list[dict[str, Any]] = []
    for i, (name, plan) in enumerate(plans, 1):
        q = quality(engine, calibration, plan) if plan else Quality(0.0, 1.0, calibration.positions)
        saved = plan_bytes_saved(shapes, plan, engine.weight_itemsize)
        row = {"name": name, "plan_size": len(plan), "bytes_saved": saved, "kl": q.kl, "agreement": q.agreement}
        if name.startswith("random"):
            row["target_gap"] = saved - target
        rows.append(row)
        progress(f"  alternative {i}/{len(plans)} {name}: {len(plan)} projections, "
                 f"{saved / 2**20:.1f} MiB saved, KL {q.kl:.2e}, agreement {q.agreement:.2f}")
    return rows
