"""Prometheus text exposition of the engine's state (called in the engine thread)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kernelloop.engine.loop import EngineLoop


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ")


def render_metrics(loop: "EngineLoop") -> str:
    engine = loop.engine
    sched = engine.scheduler
    cache = engine.cache
    lines: list[str] = []

    def metric(name: str, kind: str, help_: str, samples: list[tuple[str, float]]) -> None:
        lines.append(f"# HELP kernelloop_{name} {help_}")
        lines.append(f"# TYPE kernelloop_{name} {kind}")
        lines.extend(f"kernelloop_{name}{labels} {value}" for labels, value in samples)

    metric("generation_tokens_per_second", "gauge", "Output tokens per second over the last 10 s.",
           [("", round(loop.tokens_per_second(), 3))])
    metric("generated_tokens_total", "counter", "Output tokens generated.", [("", engine.stats["generated_tokens"])])
    metric("prompt_tokens_total", "counter", "Prompt tokens received.", [("", engine.stats["prompt_tokens"])])
    metric("running_requests", "gauge", "Requests decoding or prefilling.",
           [("", len(sched.running) + (1 if sched.chunked else 0))])
    metric("waiting_requests", "gauge", "Requests queued for admission.", [("", len(sched.waiting))])
    metric("kv_cache_usage", "gauge", "Share of KV slots in use (requests and prefix cache).",
           [("", round(engine.kv_usage(), 4))])
    metric("prefix_cache_hit_rate", "gauge", "Cached prompt tokens / prompt tokens looked up.",
           [("", round(cache.hit_rate, 4))])
    metric("forwards_total", "counter", "Model forward passes.", [("", engine.stats["forwards"])])
    variants = [(f'{{op="{op}",shape="{_escape(where)}",variant="{_escape(name)}"}}', 1)
                for op, uses in engine.kernels.variants_in_use().items() for where, name in sorted(uses.items())]
    metric("kernel_variant", "gauge", "Kernel variant serving each op and (dtype, shape bucket) seen so far.", variants)
    demoted = [(f'{{op="{d.op}",shape="{_escape(d.where)}",variant="{_escape(d.variant)}",now="{_escape(d.now)}"}}', 1)
               for d in engine.kernels.demotions]
    metric("kernel_demoted", "gauge", "Kernel variants that raised and were replaced by the next in their chain "
           "(registry entry, baseline, reference) since the last kernel reload.", demoted)
    metric("kernel_registry_error", "gauge", "1 when the kernel registry could not be read (baselines in use).",
           [("", 1 if engine.kernels.registry_error else 0)])
    kd = engine.kernels
    metric("deterministic", "gauge", "1 when only batch-invariant kernel variants serve (engine serve --deterministic).",
           [("", 1 if kd.deterministic else 0)])
    fallbacks = [(f'{{op="{op}",shape="{_escape(where)}",variant="{_escape(name)}"}}', 1)
                 for op, uses in kd.deterministic_fallbacks().items() for where, name in sorted(uses.items())]
    metric("deterministic_fallback", "gauge", "Deterministic mode: ops and shapes no batch-invariant registry kernel "
           "serves, and the invariant variant serving instead (baseline, reference, or rowwise: the reference a row "
           "at a time).", fallbacks)
    return "\n".join(lines) + "\n"
