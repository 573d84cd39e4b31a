"""`LocalEngine`: an engine handle (agent/engine_handle.py) on an Engine in this process.

The Engine is built on first use (a tune run that resumes past its profile and gate never builds
it). This is the one agent module that imports the engine: the tune loop's engine and its float32
reference, and `agent profile` without `--engine`, are LocalEngines.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from kernelloop.agent.gate import Measurement
from kernelloop.agent.gate_config import GateConfig
from kernelloop.common.progress import Progress
from kernelloop.engine import gate_invariance, gate_measure
from kernelloop.engine.engine import Engine, EngineConfig
from kernelloop.engine.teacher_force import TeacherForced, served_logprobs, served_logprobs_many
from kernelloop.engine.tokenizer import Tokenizer
from kernelloop.profiler.inprocess import profile_engine
from kernelloop.profiler.workload import WorkloadRequest


class LocalEngine:
    """An in-process engine. `fields` are EngineConfig's (model, device, kernels, registry, dtype,
    cuda_graphs, random_weights, ...), `registry` a path or the caller's Registry object (the engine then
    serves from that one); `progress` hears "starting <name> (...)" when the engine is built."""

    def __init__(self, *, name: str = "the engine", progress: Progress = lambda message: None, **fields: Any) -> None:
        from kernelloop.kernels.registry import Registry

        given = fields.get("registry")
        self._registry = given if isinstance(given, Registry) else None
        if self._registry is not None:
            fields["registry"] = str(self._registry.path)
        self.config = EngineConfig(**fields)
        self.name, self.progress = name, progress
        self._engine: Engine | None = None

    @property
    def engine(self) -> Engine:
        if self._engine is None:
            c = self.config
            kind = f"{c.kernels} kernels" + (f", {c.dtype}" if c.dtype != "auto" else "")
            self.progress(f"starting {self.name} ({c.model or 'embedded model'}, {c.device}, {kind})")
            self._engine = Engine(self.config, registry=self._registry)
        return self._engine

    @property
    def tokenizer(self) -> Tokenizer:
        return self.engine.tokenizer

    def profile(self, workload: list[WorkloadRequest], progress: Progress = lambda message: None, *,
                concurrency: int = 4, seconds: float | None = None, trace_path: Path | None = None) -> dict[str, Any]:
        """Profile the engine on `workload` (at most `concurrency` requests at once, at most `seconds`;
        a Chrome trace at `trace_path` if given)."""
        return profile_engine(self.engine, workload, concurrency=concurrency, seconds=seconds,
                              trace_path=trace_path, progress=progress)

    def reload(self, revision: str | None = None) -> dict[str, Any]:
        return self.engine.reload_kernels(revision)

    def measure(self, prompt_ids: list[list[int]], config: GateConfig, warmup: bool = True) -> Measurement:
        m = gate_measure.measure(self.engine, prompt_ids, config.max_tokens, warmup)
        return Measurement(m.greedy, m.logprobs, m.tokens_per_second)

    def generate(self, prompt_ids: list[list[int]], max_tokens: int, seeds: list[int | None]) -> list[list[int]]:
        return gate_measure.generate(self.engine, prompt_ids, max_tokens, seeds)

    def invariance(self, prompt_ids: list[list[int]], max_tokens: int, batch: int) -> dict[str, Any]:
        return gate_invariance.probe(self.engine, prompt_ids, max_tokens, batch)

    def served_logprobs(self, prompt_ids: list[int], served_ids: list[int]) -> TeacherForced:
        """This engine's log-distributions at each of `served_ids` after `prompt_ids` (one forward;
        the shadow audit's reference side)."""
        return served_logprobs(self.engine, prompt_ids, served_ids)

    def projections(self) -> dict[str, tuple[int, int]]:
        """scope -> (N, K) of every projection the model calls through `Dispatcher.linear_at`, in forward order."""
        model = self.engine.model
        scopes = {f"layers.{i}.{name}": tuple(getattr(layer, name).shape)
                  for i, layer in enumerate(model.layers) for name in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")}
        return {**scopes, "lm_head": tuple(model.lm_head.shape)}

    @property
    def weight_itemsize(self) -> int:
        """Bytes per value of the model's unquantized weights (its serving dtype)."""
        return self.engine.model.dtype.itemsize

    def planned_logprobs(self, pairs: list[tuple[list[int], list[int]]], plan: dict[str, str]) -> list[torch.Tensor]:
        """Teacher-forced log-distributions ([len(served), vocab] float32 each) of (prompt ids, served ids) pairs
        with the projections of `plan` (scope -> scheme) quantized in this process; the plan is cleared after."""
        kernels = self.engine.kernels
        kernels.set_quant_plan(plan)
        try:
            return self.forced_logprobs(pairs)
        finally:
            kernels.set_quant_plan({})

    def forced_logprobs(self, pairs: list[tuple[list[int], list[int]]]) -> list[torch.Tensor]:
        """Teacher-forced log-distributions ([len(served), vocab] float32 each) of (prompt ids, served ids) pairs,
        through the kernels this engine serves."""
        return [t.logprobs for t in served_logprobs_many(self.engine, pairs)]

    def close(self) -> None:
        self._engine = None
