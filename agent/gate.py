"""The end-to-end quality gate: a kernel change must not change what the model says.

Over a fixed prompt set, greedy decoding runs on the engine as it was (before the registry commit)
and as it is (after commit + reload), and on a reference engine (float32 torch ops, no Triton); each is
reached through an engine handle (agent/engine_handle.py: in this process or over HTTP, measured by the
same engine code either way). At every generated position the full next-token distribution is captured
in float64 (Engine.logits_hook), and KL(reference || engine) is averaged over positions. The change passes when

    greedy tokens after == greedy tokens before        (bitwise-stable decoding)
    KL after <= KL before + kl_margin                  (no silent quality loss)
    no new batch divergence                            (agent/invariance.py: each prompt decoded alone, in a
                                                        batch of 16 and with a prefix-cache hit must agree
                                                        after wherever it agreed before)
    no new runaway in long generations                 (agent/runaway.py: a few prompts, greedy and seeded
                                                        sampling, `runaway_tokens` long; an n-gram repeated
                                                        back to back past `runaway_repeats` after, not before)
    task accuracy not confidently lower                (agent/task_audit.py: a suite of agent-shaped tasks,
                                                        JSON, tool calls, a 15-step trace, answered greedily;
                                                        fails when the whole interval of after/before accuracy
                                                        is below 1 - task_tolerance)
    tokens/s not slower: the 95% interval of after/before (median over alternated rounds) reaches
    1 - tps_tolerance

A commit that changes numerics on purpose (agent quantize's scoped entries) is judged in budget mode
(GateConfig.kl_budget): KL after <= kl_budget replaces the first two lines, greedy agreement with before
is reported instead of required, and the CPU interpreter's tokens/s are reported without deciding.

Speed is measured the way the sandbox measures kernels, so other work on the machine cannot fail
the gate: the engine is reloaded at the registry commit before and at the one after, alternately,
for `speed_rounds` rounds, and each round gives one ratio. Only when every plausible ratio is a
drop does the gate fail.

A failed gate is the caller's cue to roll the registry commit back and reload.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from statistics import median
from typing import Any, Callable, Protocol

import torch

from kernelloop.agent.gate_config import GateConfig
from kernelloop.agent.invariance import invariance_rows
from kernelloop.agent.runaway import PromptLoops, new_loops
from kernelloop.agent.task_audit import TaskComparison, compare
from kernelloop.common.progress import Progress, Step
from kernelloop.common.stats import median_interval


@dataclass
class Measurement:
    """One gate measurement of an engine (agent/engine_handle.py `measure`; taken by engine/gate_measure.py)."""

    greedy: list[list[int]]
    logprobs: list[torch.Tensor] = field(repr=False)  # per prompt: [positions, vocab] float64 log-probabilities
    tokens_per_second: float


@dataclass
class GateResult:
    ok: bool
    reason: str
    kl_before: float
    kl_after: float
    greedy_same: bool
    tps_before: float                # medians over the alternated rounds
    tps_after: float
    tps_ratio: float | None = None   # median of after/before over the rounds, with its 95% interval
    tps_interval: list[float] | None = None
    speed_rounds: int = 0
    runaway: list[dict[str, Any]] = field(default_factory=list)  # per long generation: agent/runaway.py PromptLoops
    invariance: list[dict[str, Any]] = field(default_factory=list)  # per prompt: agent/invariance.py rows
    tasks: dict[str, Any] | None = None  # agent/task_audit.py TaskComparison, when the audit ran
    kl_budget: float | None = None  # the budget gate's (GateConfig.kl_budget); None: the identity gate
    agreement: float | None = None  # budget gate: share of generated positions whose greedy token is before's
    forced_agreement: float | None = None  # budget gate: share of teacher-forced positions whose argmax is the reference's

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class HasTokenizer(Protocol):
    tokenizer: Any  # engine/tokenizer.py's Tokenizer: chat_template, encode, apply_chat_template


def prompt_ids(engine: HasTokenizer, prompts: tuple[str, ...]) -> list[list[int]]:
    """The gate prompts as token ids (chat-templated when the model has a template), by the tokenizer of
    `engine` (an Engine, or a LocalEngine handle)."""
    if engine.tokenizer.chat_template is not None:
        return [chat_ids(engine, [{"role": "user", "content": p}]) for p in prompts]
    return [engine.tokenizer.encode(p) for p in prompts]


def chat_ids(engine: HasTokenizer, messages: list[dict[str, str]]) -> list[int]:
    """A conversation as token ids the way the engine serves a chat request (the model's chat template); a
    model without one gets "role: content" lines and "assistant:", as a completion prompt."""
    tok = engine.tokenizer
    if tok.chat_template is not None:
        return tok.encode(tok.apply_chat_template(messages), add_special_tokens=False)
    return tok.encode("".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant:")


def alternate_speed(measure_at: Callable[[str, bool], float], before: str, after: str, rounds: int,
                    progress: Progress = lambda message: None) -> dict[str, Any]:
    """tokens/s at registry commit `before` and at `after`, alternated `rounds` times (the order flips
    every round, so a drift in machine load hits both sides alike). `measure_at(revision, warmup)`
    reloads the engine at that commit and returns one tokens/s figure, after an untimed warm-up on a
    commit's first visit (its kernels' one-time costs); the caller reloads the engine at HEAD after."""
    tps_before, tps_after = [], []
    for i in range(max(1, rounds)):
        order = ((before, tps_before), (after, tps_after))
        for revision, sink in (order if i % 2 == 0 else order[::-1]):
            sink.append(measure_at(revision, i == 0))
        figures = (f"tokens/s before {tps_before[-1]:.1f}, after {tps_after[-1]:.1f} "
                   f"({tps_after[-1] / max(tps_before[-1], 1e-12):.2f}x)")
        progress(Step(f"  gate round {i + 1}/{rounds}: {figures}", "gate rounds", i + 1, max(1, rounds),
                      detail=figures, log=True))
    ratios = [a / max(b, 1e-12) for a, b in zip(tps_after, tps_before)]
    ratio, lo, hi = median_interval(ratios)
    return {"before": tps_before, "after": tps_after, "ratios": ratios, "ratio": ratio, "interval": [lo, hi]}


def mean_kl(reference: Measurement, other: Measurement) -> float:
    """Mean over prompts and positions of KL(reference || other), in nats."""
    total, n = 0.0, 0
    for ref, oth in zip(reference.logprobs, other.logprobs):
        positions = min(len(ref), len(oth))
        p = ref[:positions].exp()
        total += float((p * (ref[:positions] - oth[:positions])).sum())
        n += positions
    return total / max(n, 1)


def summary(reference: Measurement, measured: Measurement, **checks: dict[str, Any] | None) -> dict[str, Any]:
    """What the gate keeps of one measurement (plain JSON, so a checkpoint can hold it), with the checks'
    data when taken: `long` (LoopContext.long_generations), `invariance` (LoopContext.batch_invariance),
    `tasks` (LoopContext.task_audit).
    Its speed is judged from `alternate_speed()`, not from this one figure."""
    kept = {"greedy": measured.greedy, "kl": mean_kl(reference, measured)}
    return {**kept, **{name: data for name, data in checks.items() if data is not None}}


def runaway_rows(before: dict[str, Any], after: dict[str, Any], config: GateConfig) -> list[PromptLoops]:
    """The runaway check's rows, when both summaries hold the same long generations; else none."""
    b, a = before.get("long"), after.get("long")
    if not b or not a or b["sampling"] != a["sampling"]:
        return []
    return new_loops(b["outputs"], a["outputs"], a["sampling"], config.runaway_repeats)


def task_comparison(before: dict[str, Any], after: dict[str, Any], config: GateConfig) -> TaskComparison | None:
    """The task audit's comparison, when both summaries hold an audit of the same suite; else none."""
    b, a = before.get("tasks"), after.get("tasks")
    if not b or not a or b["suite"] != a["suite"] or b["ids"] != a["ids"]:
        return None
    return compare(b, a, config.task_tolerance)


@dataclass
class _Checks:
    """The checks both gates share, taken from two summaries: runaway, batch invariance, tasks."""

    loops: list[PromptLoops]
    runaways: list[PromptLoops]
    diverged: list[dict[str, Any]]
    tasks: TaskComparison | None

    def failure(self, config: GateConfig) -> str:
        """The first failing shared check's reason, or ""."""
        if self.diverged:
            row = self.diverged[0]
            return (f"batch invariance: prompt {row['prompt']} decodes differently {row['after']}"
                    + (f"; {len(self.diverged) - 1} more prompts" if len(self.diverged) > 1 else ""))
        if self.runaways:
            return f"runaway: {self.runaways[0].describe()}" + (
                f"; {len(self.runaways) - 1} more" if len(self.runaways) > 1 else "")
        if self.tasks is not None and self.tasks.failed:
            return f"tasks: {self.tasks.describe()} (tolerance {config.task_tolerance:g})"
        return ""

    def passed(self, invariance_rows: int) -> str:
        """What the shared checks found when they passed, for the gate's reason."""
        text = f"no new loop in {len(self.loops)} long generations; " if self.loops else ""
        if invariance_rows:
            text = f"no new batch divergence in {invariance_rows} prompts; " + text
        if self.tasks is not None:
            text += f"tasks {self.tasks.describe()}; "
        return text


INTERPRETED_NOTE = " (cpu-interpreter timings: reported, not judged)"


def greedy_agreement(before: list[list[int]], after: list[list[int]]) -> float:
    """Share of generated positions where after's token equals before's, position by position (a position
    only one side generated counts as a disagreement)."""
    same = total = 0
    for b, a in zip(before, after):
        same += sum(x == y for x, y in zip(b, a))
        total += max(len(b), len(a))
    return same / total if total else 1.0


def judge(before: dict[str, Any], after: dict[str, Any], speed: dict[str, Any], config: GateConfig,
          interpreted: bool = False) -> GateResult:
    """Compare two `summary()`s and an `alternate_speed()`, in this order: greedy tokens identical, KL not
    grown past the margin, no new batch divergence, no new runaway, task accuracy not confidently lower,
    tokens/s not confidently slower. With `config.kl_budget` set, `judge_budget` instead. `interpreted`: the
    timings are the CPU interpreter's (reported, never deciding: they move with the machine's other work
    more than kernels move them)."""
    kl_before, kl_after = before["kl"], after["kl"]
    tps_before, tps_after = median(speed["before"]), median(speed["after"])
    lo, hi = speed["interval"]
    same = after["greedy"] == before["greedy"]
    result = GateResult(True, "", kl_before, kl_after, same, tps_before, tps_after, speed["ratio"], [lo, hi],
                        len(speed["ratios"]))
    rounds = f"{len(speed['ratios'])} alternated round{'s' if len(speed['ratios']) != 1 else ''}"
    loops = runaway_rows(before, after, config)
    result.runaway = [row.to_json() for row in loops]
    both = before.get("invariance") and after.get("invariance")
    result.invariance = invariance_rows(before["invariance"], after["invariance"]) if both else []
    tasks = task_comparison(before, after, config)
    result.tasks = tasks.to_json() if tasks is not None else None
    checks = _Checks(loops, [row for row in loops if row.runaway], [row for row in result.invariance if row["new"]],
                     tasks)
    tps = f"tokens/s {tps_before:.1f} -> {tps_after:.1f} ({speed['ratio']:.2f}x [{lo:.2f}, {hi:.2f}] over {rounds})"
    if config.kl_budget is not None:
        return judge_budget(result, before, after, checks, config, tps, interpreted)
    failed = checks.failure(config)
    if not same:
        diff = next(i for i, (a, b) in enumerate(zip(after["greedy"], before["greedy"])) if a != b)
        result.ok, result.reason = False, f"greedy output of prompt {diff} changed ({config.prompts[diff]!r})"
    elif kl_after > kl_before + config.kl_margin:
        result.ok, result.reason = False, (f"KL to the reference grew from {kl_before:.2e} to {kl_after:.2e} nats "
                                           f"(margin {config.kl_margin:.0e})")
    elif failed:
        result.ok, result.reason = False, failed
    elif not interpreted and hi < 1 - config.tps_tolerance:
        result.ok, result.reason = False, (f"tokens/s dropped: {tps_before:.1f} -> {tps_after:.1f}, after/before "
                                           f"{speed['ratio']:.2f}x [{lo:.2f}, {hi:.2f}] over {rounds}")
    else:
        result.reason = (f"greedy outputs unchanged; KL {kl_before:.2e} -> {kl_after:.2e} nats; "
                         f"{checks.passed(len(result.invariance))}{tps}{INTERPRETED_NOTE if interpreted else ''}")
    return result


def agreement_text(result: GateResult, generated: int, forced_positions: int | None) -> str:
    """Greedy agreement as the budget gate reports it: teacher-forced first where it was measured (every position
    scored in the reference's context), then free-running, which stops agreeing at the first changed token (after
    a near-tie on a short gate prompt, most of its positions)."""
    free = f"greedy agreement {result.agreement:.0%} free-running over {generated} tokens"
    if result.forced_agreement is None:
        return free
    return f"greedy agreement {result.forced_agreement:.0%} teacher-forced over {forced_positions} positions ({free})"


def judge_budget(result: GateResult, before: dict[str, Any], after: dict[str, Any], checks: _Checks,
                 config: GateConfig, tps: str, interpreted: bool) -> GateResult:
    """The budget gate (agent quantize): KL after <= config.kl_budget instead of identical greedy tokens, whose
    agreement with before is reported; the shared checks as in `judge`; speed decides only where it is not
    the interpreter's."""
    budget = config.kl_budget
    assert budget is not None
    result.kl_budget = budget
    result.agreement = greedy_agreement(before["greedy"], after["greedy"])
    result.forced_agreement = after.get("forced_agreement")
    agreement = agreement_text(result, sum(map(len, before["greedy"])), after.get("kl_positions"))
    lo, hi = result.tps_interval or [1.0, 1.0]
    failed = checks.failure(config)
    if result.kl_after > budget:
        result.ok, result.reason = False, (f"KL to the reference {result.kl_after:.2e} nats is over the budget "
                                           f"{budget:.2e} ({agreement})")
    elif failed:
        result.ok, result.reason = False, failed
    elif not interpreted and hi < 1 - config.tps_tolerance:
        result.ok, result.reason = False, f"tokens/s dropped: {tps}"
    else:
        result.reason = (f"KL {result.kl_before:.2e} -> {result.kl_after:.2e} nats, within the budget {budget:.2e}; "
                         f"{agreement}; {checks.passed(len(result.invariance))}{tps}"
                         + (INTERPRETED_NOTE if interpreted else ""))
    return result
