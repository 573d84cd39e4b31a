"""The judge's decisions, in the judge's own process, on data it received and values it computed.

Expected outputs come from the reference on inputs the judge generated itself; the candidate's
process never held them. What a sandboxed process *says* (facts, its record) can only hurt it: a
reported violation or forbidden op is a failure, but nothing it reports makes a candidate pass. The
first failure decides the verdict.
"""

from __future__ import annotations

from statistics import median as _median
from typing import Any

import torch

from kernelloop.common.stats import ALPHA, median_interval, order_rank
from kernelloop.kernels import interpreter_bounds as bounds
from kernelloop.kernels.candidate.runtime_purity import IMPURE
from kernelloop.kernels.compare import Comparison, check_outputs
from kernelloop.kernels.device import Device
from kernelloop.kernels.roofline import Rates
from kernelloop.kernels.spec import OpSpec
from kernelloop.sandbox.judge.aliasing import overlap
from kernelloop.sandbox.verdict import Check, Verdict


def label(shape: dict, dtype: str, variant: dict | None = None) -> str:
    text = f"{dtype} " + ",".join(f"{k}={v}" for k, v in shape.items())
    return text + (" " + ",".join(f"{k}={v}" for k, v in variant.items()) if variant else "")


def bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bits of a tensor (contiguous), so comparisons are bitwise (NaN == NaN, -0 != +0)."""
    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    return t.detach().contiguous().view(ints[t.element_size()])


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(bits(a), bits(b))


def storage_bytes(t: torch.Tensor) -> torch.Tensor:
    """The whole storage behind a tensor, as bytes."""
    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage())


def input_changes(v: Verdict, where: str, before: list[torch.Tensor], after: list[torch.Tensor], by: str) -> bool:
    """Each input as it came back must be the one sent: the same view of the same bytes, in the whole
    storage behind it (its padding, the other parts of a fused buffer). A change inside a view is
    `input-mutated`; one outside it, memory the call was never given, `out-of-bounds`."""
    for j, (b, a) in enumerate(zip(before, after)):
        layout = (b.dtype, b.shape, b.stride(), b.storage_offset(), b.untyped_storage().nbytes())
        if layout != (a.dtype, a.shape, a.stride(), a.storage_offset(), a.untyped_storage().nbytes()):
            v.fail("input-mutated", f"{where}: {by} changed the layout or storage of input {j}")
        elif not same_bits(b, a):
            v.fail("input-mutated", f"{where}: {by} changed input {j}")
        elif not torch.equal(storage_bytes(b), storage_bytes(a)):
            changed = int((storage_bytes(b) != storage_bytes(a)).nonzero()[0])
            v.fail("out-of-bounds", f"{where}: {by} wrote outside input {j}'s view (byte {changed} of the "
                   f"{b.untyped_storage().nbytes()}-byte buffer behind it: its padding or another tensor's part)")
        else:
            continue
        return True
    return False


def bounds_code(text: str, otherwise: str) -> tuple[str, str]:
    """(failure code, reason) for an error text: `out-of-bounds` when an address or guard check refused
    an access (kernels/interpreter_bounds.py), else `otherwise`."""
    if bounds.MARK in text:
        return "out-of-bounds", text.split(bounds.MARK, 1)[1]
    return otherwise, text


def runtime_failure(v: Verdict, facts: dict[str, Any], where: str) -> bool:
    """Failures a sandboxed process reports about itself: blocked escapes, exceptions, memory."""
    violations = facts.get("violations") if isinstance(facts.get("violations"), list) else []
    if violations:
        v.fail("sandbox-violation", f"{where}: {str(violations[0])[:300]}")
    elif facts.get("error") and IMPURE in str(facts["error"]):  # its state changed (the loader's check)
        v.fail("impure", f"{where}: {str(facts['error']).split(IMPURE, 1)[1][:300]}")
    elif facts.get("error"):
        code, text = bounds_code(str(facts["error"]), "memory" if facts.get("memory") is True else "raised")
        v.fail(code, f"{where}: forward raised {text[:300]}")
    return v.failure is not None


def judge_call(v: Verdict, spec: OpSpec, where: str, facts: dict[str, Any], record: dict[str, Any],
               outputs: list[torch.Tensor], inputs_after: list[torch.Tensor], inputs: list[torch.Tensor],
               expected: Any, device: Device, shape: dict[str, int], compare: bool = True) -> Comparison | None:
    """One checked call of the candidate at `shape` (the op's tolerance there). Returns the comparison
    when the outputs were compared. `compare` False (a race-only trial, sandbox/judge/plan.py): every check
    but the values'."""
    if runtime_failure(v, facts, where):
        return None
    ops = facts.get("torch_ops") if isinstance(facts.get("torch_ops"), list) else []
    if ops:
        v.fail("torch-compute", f"{where}: torch computed on the candidate's path ({', '.join(map(str, ops[:3]))})")
        return None
    want = expected if isinstance(expected, tuple) else (expected,)
    if len(outputs) != len(want):
        types = facts.get("types") if isinstance(facts.get("types"), list) else []
        v.fail("bad-output", f"{where}: returned {facts.get('count', len(outputs))} outputs "
               f"({', '.join(map(str, types[:4]))}), expected {len(want)} plain {device} tensors")
        return None
    devices = facts.get("devices") if isinstance(facts.get("devices"), list) else []
    if any(d != device.kind for d in devices):
        v.fail("bad-output", f"{where}: outputs must be {device} tensors")
        return None
    for i, (o, e) in enumerate(zip(outputs, want)):
        if o.shape != e.shape or o.dtype != e.dtype:
            v.fail("bad-output", f"{where}: output {i} is {tuple(o.shape)} {o.dtype}, expected {tuple(e.shape)} {e.dtype}")
            return None
    refs = record.get("outputs") if isinstance(record.get("outputs"), list) else []
    n_inputs = len(inputs)
    for i, ref in enumerate(refs):
        if isinstance(ref, dict) and isinstance(ref.get("buf"), int) and ref["buf"] < n_inputs:
            v.fail("aliasing", f"{where}: output {i} shares memory with input {ref['buf']}")
            return None
    pair = overlap(refs)  # sandbox/judge/aliasing.py; a previous call's buffer is memory from nowhere (untraceable)
    if pair is not None:
        v.fail("aliasing", f"{where}: output {pair[0]} " + ("overlaps itself" if pair[0] == pair[1] else
                                                           f"shares memory with output {pair[1]}"))
        return None
    if input_changes(v, where, inputs, inputs_after, "the call"):
        return None
    got = tuple(outputs) if len(outputs) > 1 else outputs[0]
    comparison = check_outputs(spec, got, expected, want[0].dtype, shape=shape) if compare else None
    if comparison is not None and not comparison.ok:
        v.fail("biased" if comparison.biased else "mismatch", f"{where}: {comparison.reason}")
    elif not facts.get("launches"):
        v.fail("no-triton", f"{where}: no Triton kernel was launched")
    elif record.get("problem"):
        code, text = bounds_code(str(record["problem"]), "untraceable")
        v.fail(code, f"{where}: {text[:300]}")
    return comparison


Replays = list[tuple[int | None, list[torch.Tensor]]]  # (programs' order seed, None: grid order; outputs)
DECIDED = "decided"  # next_order: no more replays are needed


def _same_outputs(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(same_bits(x, y) for x, y in zip(a, b))


def next_order(candidate: list[torch.Tensor], replays: Replays, pending: list[int]) -> int | None | str:
    """After each replay of one call: the order of the next replay, or DECIDED. While replays match
    the candidate, the `pending` orders (more shuffled orders, for kernels with atomics) follow. After
    one differs, grid-order replays tell a race (grid order matches) from a nondeterministic kernel
    (two grid-order replays differ) and a result made outside the launches (they agree, wrongly)."""
    if all(_same_outputs(got, candidate) for _, got in replays):
        return pending.pop(0) if pending else DECIDED
    grid = [got for order, got in replays if order is None]
    if not grid or (len(grid) == 1 and not _same_outputs(grid[0], candidate)):
        return None
    return DECIDED


def _first_difference(a: list[torch.Tensor], b: list[torch.Tensor]) -> str:
    for i, (x, y) in enumerate(zip(a, b)):
        if x.shape != y.shape or x.dtype != y.dtype:
            return f"output {i} differs in shape or dtype"
        differ = (bits(x) != bits(y)).reshape(-1)
        if differ.any():
            at = tuple(int(j) for j in torch.unravel_index(differ.nonzero()[0, 0], x.shape)) if x.dim() else ()
            return f"{int(differ.sum())} of {x.numel()} elements of output {i} differ, first at {list(at)}"
    return "the outputs differ"


def judge_replays(v: Verdict, where: str, candidate: list[torch.Tensor], replays: Replays,
                  inputs: list[torch.Tensor], replay_inputs: list[torch.Tensor], device: Device) -> None:
    """The replays of the recorded launches (next_order chose them) must give the candidate's outputs,
    bit for bit, in every order their programs ran in."""
    wrong = [(order, got) for order, got in replays if not _same_outputs(got, candidate)]
    if not wrong:
        input_changes(v, where, inputs, replay_inputs, "the kernels")
        return
    grid = [got for order, got in replays if order is None]
    if grid and _same_outputs(grid[0], candidate):
        order, got = wrong[0]
        how = ("repeated beside a concurrent load" if not device.interpreted
               else f"with its programs run in a shuffled order (seed {order})")
        v.fail("race", f"{where}: its result depends on the order its programs run: {how}, "
               f"{_first_difference(candidate, got)} (a program reads another's output, or atomics accumulate "
               "in arrival order)")
    elif len(grid) > 1 and not _same_outputs(grid[0], grid[1]):
        v.fail("nondeterministic", f"{where}: two runs of the same launches on the same inputs gave different bits")
    else:
        v.fail("launch-independent", f"{where}: replaying its Triton launches alone does not give the output it "
               "returned: part of the result was made outside its kernels, or they read memory nobody wrote")


ROOFLINE_SLACK = 1.25  # measured rates are not quite the peaks; allow a call this much below the roofline


def round_ratios(rounds: list[dict[str, Any]]) -> list[float]:
    """Baseline / candidate per round, each side's median call (> 1: the candidate is faster)."""
    return [_median(r["baseline"]) / max(_median(r["candidate"]), 1e-12) for r in rounds]


def worth_confirming(rounds: list[dict[str, Any]], min_gain: float) -> bool:
    """The planned rounds' median clears the bar and their interval does not: a noisy round, or a gain
    too small to tell. Confirmation rounds decide it (`judge_timing`'s `first_look`)."""
    speedup, lo, _ = median_interval(round_ratios(rounds))
    return lo <= 1.0 + min_gain < speedup


def judge_timing(v: Verdict, spec: OpSpec, shape: dict, dtype: torch.dtype, rounds: list[dict[str, Any]],
                 min_gain: float, rates: Rates, mode: str, first_look: int = 0) -> None:
    """`rounds`: [{"baseline": [s, ...], "candidate": [s, ...]}], seconds per replayed call; `rates`:
    the device's roofline for `dtype` (no call can beat max(bytes / bandwidth, FLOPs / matmul peak)).
    `first_look`: the planned rounds' count when confirmation rounds followed (`worth_confirming`);
    the interval over all rounds then misses with at most what the first look's did not spend, so a
    slower candidate is claimed faster at most 2.5% of the time over both looks together."""
    base = [_median(r["baseline"]) for r in rounds]
    cand = [_median(r["candidate"]) for r in rounds]
    alpha = ALPHA - order_rank(first_look)[1] if first_look else ALPHA
    speedup, lo, hi = median_interval(round_ratios(rounds), alpha)
    v.speedup, v.speedup_interval = round(speedup, 4), [round(lo, 4), round(hi, 4)]
    cand_s = _median(cand)
    cost = spec.cost(shape, dtype)
    floor_s = rates.seconds(cost)
    v.timing = {
        "shape": dict(shape), "dtype": str(dtype).removeprefix("torch."), "rounds": len(rounds),
        "calls_per_round": len(rounds[0]["candidate"]), "baseline_s": _median(base), "candidate_s": cand_s,
        "rounds_detail": [{"baseline_s": b, "candidate_s": c} for b, c in zip(base, cand)], "modes": [mode],
        "achieved_bytes_per_s": cost.bytes / max(cand_s, 1e-12), "copy_bandwidth_bytes_per_s": rates.bytes_per_s,
        "achieved_flops_per_s": cost.flops / max(cand_s, 1e-12), "matmul_peak_flops_per_s": rates.flops_per_s,
        "bound": rates.bound(cost), "roofline_s": floor_s, "roofline_fraction": floor_s / max(cand_s, 1e-12),
    }
    if first_look:
        v.timing["first_look_rounds"] = first_look
    shown = f"{speedup:.3f}x [{lo:.3f}, {hi:.3f}]"
    if cand_s * ROOFLINE_SLACK < floor_s:
        v.fail("impossible-speedup", f"{shown}: {cand_s * 1e6:.3g} us per call is below the device's roofline of "
               f"{floor_s * 1e6:.3g} us ({cost.bytes / 1e6:.3g} MB at {rates.bytes_per_s / 1e9:.1f} GB/s, "
               f"{cost.flops / 1e9:.3g} GFLOP at {rates.flops_per_s / 1e12:.2f} TFLOP/s); the timing is not real")
    elif lo <= 1.0 + min_gain:
        v.fail("not-faster", f"{shown} over {v.baseline}: the interval's lower bound must exceed {1 + min_gain:.2f}")
    else:
        v.accepted = True
        v.reason = f"accepted: {shown} over {v.baseline}"


def add_check(v: Verdict, where: str, comparison: Comparison | None) -> None:
    """The trial's check: how near its tolerance and its error bounds (kernels/compare.py) it came."""
    if comparison is None:
        v.checks.append(Check(where, v.failure is None))
        return
    detail = f"{comparison.tol_fraction:.2f} of tolerance"
    if comparison.stats:
        detail += f"; error {comparison.stats_fraction:.2f} of bounds: {comparison.stats}"
    v.checks.append(Check(where, v.failure is None, detail))
