"""The search proposer: no LLM, a space of configurations and structural templates per op,
explored by measurement and seeded from the best kernel known.

The space of an op is its template module's `space(ctx)` (agent/proposers/templates/): structures
(whole row, multi-row tile, chunked loop, flat grid, per-token vs per-head, split-KV vs one pass, tiled
vs split-K GEMM) times parameters (block sizes, rows per program, warps, stages, tile order, split
policy), narrowed to what differs on the context's shapes and device. Every source starts with
``# kernelloop-search: {json}`` naming its op, template and parameters, so a kernel that came from
here can seed the next search.

Order of `propose`:

1. never a source already proposed by this object, given in `feedback`, in `ctx.failures` or equal to
   `ctx.best_source` (sha256 of the text);
2. templates with a correctness failure (in `feedback` or `ctx.failures`) and no correct result last;
3. then neighbours (one parameter changed, nearest values first) of the best anchor: the config with
   the highest measured speedup among correct `feedback` verdicts, or the config in `ctx.best_source`'s
   header (its speedup counts as 1.0: verdict speedups are relative to the current kernel);
4. then neighbours of the other anchors that were at least as fast as the current kernel (speedup >= 1);
5. then the rest in the heuristic base order: each template's list (its most promising config, then
   that config's one-parameter changes, then two, ...), the templates interleaved round-robin so the
   first picks cover every structure;
6. on a GPU, each pick is first compiled for that GPU (kernels/target_compile.py, at the context's
   two hottest shapes): a config that does not compile, spills registers or needs more shared memory
   than the GPU has is skipped (listed in `skipped`) and the next one is taken.

`seed` (0 = the plain heuristic order) reshuffles the base order reproducibly, for a second search
that should not retrace the first. An exhausted space gives [].
"""

from __future__ import annotations

import logging
import math
import random
from collections import Counter
from typing import Any, Mapping, Sequence

from kernelloop.agent.proposers.base import Feedback, Proposal, TuneContext
from kernelloop.agent.proposers.templates import config_of, module_for, parse_header
from kernelloop.kernels.device import triton_interpreted
from kernelloop.kernels.registry.entry import sha256_text
from kernelloop.kernels.spec import parse_dtype
from kernelloop.kernels.target_compile import device_target, source_problems
from kernelloop.sandbox.verdict import CORRECT_FAILURES

log = logging.getLogger(__name__)

# Verdict failure codes that keep `correct: true`: they say nothing against the template.
NOT_CORRECTNESS = frozenset(CORRECT_FAILURES)


def label_of(op: str, params: Mapping[str, Any]) -> str:
    """e.g. ``rmsnorm multirow rows=4 num_warps=4``."""
    rest = " ".join(f"{k}={v}" for k, v in params.items() if k != "template")
    return f"{op} {params['template']}" + (f" {rest}" if rest else "")


def neighbour_distance(domains: Mapping[str, Mapping[str, Sequence[Any]]], center: Mapping[str, Any],
                       params: Mapping[str, Any]) -> tuple[int, int] | None:
    """(index distance of the changed value, position of the changed param) when `params` differs from
    `center` in exactly one parameter of the same template; None otherwise."""
    if params.get("template") != center.get("template") or set(params) != set(center):
        return None
    diff = [k for k in params if k != "template" and params[k] != center[k]]
    if len(diff) != 1:
        return None
    key = diff[0]
    values = list(domains.get(params["template"], {}).get(key, ()))
    names = [k for k in params if k != "template"]
    if params[key] in values and center[key] in values:
        dist = abs(values.index(params[key]) - values.index(center[key]))
    else:
        dist = len(values) + 1
    return dist, names.index(key)


class SearchProposer:
    """Proposes configs of the op's template space, nearest to the best measured kernel first."""

    name = "search"

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed
        self._proposed: set[str] = set()
        self.skipped: list[tuple[str, str]] = []  # (config label, why): configs that do not fit this GPU
        self.last_error: str | None = None  # the Proposer protocol's; a search has no endpoint to fail
        self.rejected: Feedback = []        # likewise: every config it proposes is a candidate

    def close(self) -> None:
        """Nothing to release (the Proposer protocol's)."""

    # -- the space ---------------------------------------------------------------------------------

    def configs(self, ctx: TuneContext) -> list[dict[str, Any]]:
        """Every config of `ctx.op`'s space for this context, in the base (heuristic) order."""
        try:
            module = module_for(ctx.op)
        except KeyError:
            return []
        by_template: dict[str, list[dict[str, Any]]] = {}
        for params in module.space(ctx):
            by_template.setdefault(params["template"], []).append(params)
        lists = list(by_template.values())
        if self.seed:
            rng = random.Random(f"{self.seed}:{ctx.op}")
            rng.shuffle(lists)
            for lst in lists:
                rng.shuffle(lst)
        # Within a template: its first (most promising) config, then its one-parameter changes, then
        # two-parameter changes, ... (stable, so the template's own order breaks ties).
        lists = [sorted(lst, key=lambda p, head=lst[0]: sum(p[k] != head.get(k) for k in p)) for lst in lists]
        out: list[dict[str, Any]] = []
        for i in range(max((len(lst) for lst in lists), default=0)):
            out.extend(lst[i] for lst in lists if i < len(lst))
        return out

    # -- proposing ---------------------------------------------------------------------------------

    def propose(self, ctx: TuneContext, feedback: Feedback, n: int) -> list[Proposal]:
        if n <= 0:
            return []
        try:
            module = module_for(ctx.op)
        except KeyError:
            return []
        excluded = set(self._proposed)
        excluded.update(sha256_text(p.source) for p, _ in feedback)
        excluded.update(sha256_text(f["source"]) for f in ctx.failures if isinstance(f.get("source"), str))
        if ctx.best_source:
            excluded.add(sha256_text(ctx.best_source))

        # Configs already measured or running (by their header), even if their text would now render differently.
        known = [parse_header(ctx.best_source)] + [parse_header(p.source) for p, _ in feedback]
        known += [parse_header(f.get("source")) for f in ctx.failures]
        known_configs = [config_of(h) for h in known if h is not None and h["op"] == ctx.op]

        candidates: list[tuple[dict[str, Any], str, str]] = []
        for params in self.configs(ctx):
            if params in known_configs:
                continue
            source = module.render(params)
            digest = sha256_text(source)
            if digest in excluded:
                continue
            excluded.add(digest)  # two configs rendering the same text count once
            candidates.append((params, source, digest))
        if not candidates:
            return []

        anchors, penalised = self._evidence(ctx, feedback)

        def rank(item: tuple[int, tuple[dict[str, Any], str, str]]) -> tuple:
            index, (params, _, _) = item
            tier, sub = 2, (0, 0, 0)
            for a_index, (speedup, anchor) in enumerate(anchors):
                if a_index > 0 and speedup < 1.0:
                    break
                d = neighbour_distance(module.DOMAINS, anchor, params)
                if d is not None:
                    tier, sub = (0 if a_index == 0 else 1), (a_index, *d)
                    break
            return (params["template"] in penalised, tier, sub, index)

        ordered = [c for _, c in sorted(enumerate(candidates), key=rank)]
        out = []
        for params, source, digest in ordered:
            if len(out) == n:
                break
            self._proposed.add(digest)
            if not self._fits_gpu(ctx, params, source):
                continue
            out.append(Proposal(source=source, proposer=self.name, label=label_of(ctx.op, params)))
        return out

    def _fits_gpu(self, ctx: TuneContext, params: dict[str, Any], source: str) -> bool:
        """On a GPU, compile the config for this GPU first: one that spills, needs more shared memory
        than the GPU has, or does not compile is skipped instead of costing a sandbox run."""
        target = device_target() if not ctx.device.interpreted and not triton_interpreted() else None
        if target is None:
            return True
        shapes = list(ctx.shapes[:2]) or list(ctx.spec.engine_shapes[:1])
        try:
            problems = source_problems(source, ctx.spec, shapes, parse_dtype(ctx.dtype), target)
        except Exception as exc:  # noqa: BLE001  (the sandbox will say what is wrong; do not guess here)
            log.info("search: compile check of %s failed (%s); proposing it anyway", label_of(ctx.op, params), exc)
            return True
        if problems:
            self.skipped.append((label_of(ctx.op, params), problems[0]))
            log.info("search: skipping %s on %s: %s", label_of(ctx.op, params), target, problems[0])
        return not problems

    def _evidence(self, ctx: TuneContext, feedback: list[tuple[Proposal, dict]]
                  ) -> tuple[list[tuple[float, dict[str, Any]]], set[str]]:
        """Anchors (speedup, config), best first, and the templates to deprioritise (with `ctx.batch_invariant`,
        those whose correct kernels were not batch invariant too)."""
        anchors: list[tuple[float, dict[str, Any]]] = []
        correct_templates: set[str] = set()
        failed = Counter()
        seed = parse_header(ctx.best_source)
        if seed is not None and seed["op"] == ctx.op:
            anchors.append((1.0, config_of(seed)))
            correct_templates.add(seed["template"])
        for proposal, verdict in feedback:
            header = parse_header(proposal.source)
            if header is None or header["op"] != ctx.op:
                continue
            config = config_of(header)
            if ctx.batch_invariant and verdict.get("correct") and verdict.get("batch_invariant") is False:
                failed[config["template"]] += 1  # --batch-invariant: a correct kernel that is not cannot win
                continue
            if verdict.get("correct"):
                correct_templates.add(config["template"])
                speedup = verdict.get("speedup")
                if (isinstance(speedup, (int, float)) and not isinstance(speedup, bool) and math.isfinite(speedup)
                        and verdict.get("failure") != "impossible-speedup"):
                    anchors.append((float(speedup), config))
            else:
                failed[config["template"]] += 1
        for failure in ctx.failures:
            header = parse_header(failure.get("source"))
            if header is None or header["op"] != ctx.op or failure.get("failure") in NOT_CORRECTNESS:
                continue
            failed[header["template"]] += 1
        anchors.sort(key=lambda a: -a[0])  # stable: on a tie the current kernel's config stays first
        return anchors, {t for t in failed if t not in correct_templates}
