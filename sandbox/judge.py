"""Turning what the candidate's process sent into a verdict, in the judge's own process.

Expected outputs are computed here, from the reference on inputs regenerated from the same seeds,
so the candidate's process never holds them. The first failure decides the verdict.
"""

from __future__ import annotations

import random
from statistics import median as _median
from typing import Any

import torch

from kernels.compare import as_tuple, check_outputs
from kernels.spec import OpSpec, parse_dtype
from sandbox.roofline import ROOFLINE_SLACK
from sandbox.verdict import Check, Verdict

BOOTSTRAP_RESAMPLES = 2000


def _label(trial: dict[str, Any]) -> str:
    shape = ",".join(f"{k}={v}" for k, v in trial["shape"].items())
    return f"{trial['dtype']} {shape}"


def _expected(spec: OpSpec, shape: dict, dtype: str, seed: int) -> Any:
    return spec.reference(*spec.make_inputs(shape, parse_dtype(dtype), seed, "cpu"))


def _runtime_failure(v: Verdict, facts: dict[str, Any], where: str) -> bool:
    """Failures any message can carry: blocked escapes, exceptions, memory. True if one was found."""
    if facts.get("violations"):
        v.fail("sandbox-violation", f"{where}: {facts['violations'][0]}")
    elif facts.get("error"):
        v.fail("memory" if facts.get("memory") else "raised", f"{where}: forward raised {facts['error']}")
    return v.failure is not None


def _shape_problem(outputs: list[torch.Tensor], expected: tuple) -> str:
    if len(outputs) != len(expected):
        return f"returned {len(outputs)} outputs, expected {len(expected)}"
    for i, (o, e) in enumerate(zip(outputs, expected)):
        if o.shape != e.shape or o.dtype != e.dtype:
            return f"output {i} is {tuple(o.shape)} {o.dtype}, expected {tuple(e.shape)} {e.dtype}"
    return ""


def judge_trial(v: Verdict, spec: OpSpec, trial: dict[str, Any], facts: dict[str, Any],
                outputs: list[torch.Tensor | None], device: str) -> None:
    where = _label(trial)
    if _runtime_failure(v, facts, where):
        return
    if facts.get("torch_ops"):
        v.fail("torch-compute", f"{where}: torch computed on the candidate's path ({', '.join(facts['torch_ops'][:3])})")
        return
    for key, code in (("bad_output", "bad-output"), ("aliasing", "aliasing"), ("input_mutated", "input-mutated")):
        if facts.get(key):
            v.fail(code, f"{where}: {facts[key]}")
            return
    if any(o is None for o in outputs) or any(d != torch.device(device).type for d in facts.get("devices", [])):
        v.fail("bad-output", f"{where}: outputs must be {device} tensors of the op's dtype")
        return
    expected = _expected(spec, trial["shape"], trial["dtype"], trial["seed"])
    shape_problem = _shape_problem(outputs, as_tuple(expected))
    if shape_problem:
        v.fail("bad-output", f"{where}: {shape_problem}")
        return
    got = tuple(outputs) if spec.num_outputs > 1 else outputs[0]
    comparison = check_outputs(spec, got, expected, parse_dtype(trial["dtype"]))
    if trial.get("suppress"):
        if comparison.ok:
            v.fail("launch-independent", f"{where}: the output was right with every Triton launch suppressed")
        v.checks.append(Check(f"launch-dependence {where}", v.failure is None))
        return
    if not comparison.ok:
        v.fail("mismatch", f"{where}: {comparison.reason}")
    elif facts.get("launches", 0) == 0:
        v.fail("no-triton", f"{where}: no Triton kernel was launched")
    elif facts.get("deterministic") is False:
        v.fail("nondeterministic", f"{where}: two calls on the same inputs gave different bits")
    v.checks.append(Check(where, v.failure is None, f"{comparison.tol_fraction:.2f} of tolerance"))



def speedup_interval(ratios: list[float], seed: int = 0) -> tuple[float, float, float]:
    """Median of per-round ratios and its 95% bootstrap interval (rounds resampled)."""
    rng = random.Random(seed)
    medians = sorted(_median([rng.choice(ratios) for _ in ratios]) for _ in range(BOOTSTRAP_RESAMPLES))
    return _median(ratios), medians[int(0.025 * len(medians))], medians[int(0.975 * len(medians)) - 1]


def judge_timing(v: Verdict, spec: OpSpec, timing: dict[str, Any], facts: dict[str, Any],
                 outputs: list[torch.Tensor | None], min_gain: float, bandwidth: float) -> None:
    if _runtime_failure(v, facts, "timing"):
        return
    if facts.get("bad_output"):
        v.fail("bad-output", f"timing: {facts['bad_output']}")
        return
    rounds = facts.get("rounds") or []
    per_round = spec.num_outputs
    if len(rounds) != len(timing["seeds"]) or len(outputs) != per_round * len(rounds):
        v.fail("crash", "timing: the candidate's process sent an incomplete timing record")
        return
    for i, seed in enumerate(timing["seeds"]):  # outputs of timed calls are checked too
        got = outputs[i * per_round:(i + 1) * per_round]
        got = tuple(got) if per_round > 1 else got[0]
        if got is None or (isinstance(got, tuple) and any(o is None for o in got)):
            v.fail("bad-output", "timing: a timed call returned a tensor of the wrong dtype")
            return
        comparison = check_outputs(spec, got, _expected(spec, timing["shape"], timing["dtype"], seed),
                                   parse_dtype(timing["dtype"]))
        if not comparison.ok:
            v.fail("mismatch", f"timing round {i + 1}: a timed call's output was wrong: {comparison.reason}")
            return
    base = [_median(r["baseline"]) for r in rounds]
    cand = [_median(r["candidate"]) for r in rounds]
    ratios = [b / max(c, 1e-12) for b, c in zip(base, cand)]
    speedup, lo, hi = speedup_interval(ratios)
    v.speedup, v.speedup_interval = round(speedup, 4), [round(lo, 4), round(hi, 4)]
    cost = spec.cost(timing["shape"], parse_dtype(timing["dtype"]))
    cand_s = _median(cand)
    achieved = cost.bytes / max(cand_s, 1e-12)
    v.timing = {
        "shape": timing["shape"], "dtype": timing["dtype"], "rounds": len(rounds),
        "calls_per_round": len(rounds[0]["candidate"]), "baseline_s": _median(base), "candidate_s": cand_s,
        "rounds_detail": [{"baseline_s": b, "candidate_s": c} for b, c in zip(base, cand)],
        "modes": sorted({r.get("candidate_mode", "") for r in rounds}),
        "achieved_bytes_per_s": achieved, "copy_bandwidth_bytes_per_s": bandwidth,
        "roofline_fraction": achieved / bandwidth if bandwidth else None,
    }
    shown = f"{speedup:.3f}x [{lo:.3f}, {hi:.3f}]"
    if bandwidth and achieved > ROOFLINE_SLACK * bandwidth:
        v.fail("impossible-speedup", f"{shown}: {achieved / 1e9:.1f} GB/s is beyond the device's "
               f"{bandwidth / 1e9:.1f} GB/s copy bandwidth; the timing is not real")
    elif lo <= 1.0 + min_gain:
        v.fail("not-faster", f"{shown} over {v.baseline}: the interval's lower bound must exceed {1 + min_gain:.2f}")
    else:
        v.accepted = True
        v.reason = f"accepted: {shown} over {v.baseline}"
