"""The live objects a tune run needs (not checkpointed; rebuilt when a run resumes)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from agent.gate import GateConfig, Measurement, measure, prompt_ids
from agent.remote import RemoteEngine
from engine.engine import Engine, EngineConfig
from profiler.inprocess import profile_engine
from profiler.workload import WorkloadRequest
from history import History
from kernels.registry import Registry
from sandbox import CheckOptions, Sandbox


@dataclass
class LoopContext:
    history: History
    registry: Registry
    proposers: dict[str, Any]            # name -> object with propose(ctx, feedback, n)
    device: str = "cpu"
    model: str | None = None             # model directory; None: the embedded model
    remote: RemoteEngine | None = None   # tune a serving engine over HTTP instead of an in-process one
    random_weights: bool = False         # a shapes-only model directory (no weights): seeded random weights
    gate: GateConfig = field(default_factory=GateConfig)
    progress: Callable[[str], None] = lambda message: None
    _engine: Engine | None = None
    _reference: Engine | None = None
    _sandboxes: dict[tuple, Sandbox] = field(default_factory=dict)

    @property
    def engine(self) -> Engine:
        """The engine being tuned: registry kernels, reloaded after every commit or rollback."""
        if self._engine is None:
            self.progress(f"starting the engine ({self.model or 'embedded model'}, {self.device}, registry kernels)")
            self._engine = Engine(EngineConfig(model=self.model, device=self.device, kernels="registry",
                                               registry=str(self.registry.path), random_weights=self.random_weights))
        return self._engine

    @property
    def reference(self) -> Engine:
        """The same model (same seeded weights) with float32 torch ops: the gate's ground truth. Never
        captured into CUDA graphs: the reference ops sync with the host (decode attention reads lengths)."""
        if self._reference is None:
            self._reference = Engine(EngineConfig(model=self.model, device=self.device, kernels="reference",
                                                  dtype="float32", cuda_graphs=False,
                                                  random_weights=self.random_weights))
        return self._reference

    # -- the engine being tuned: in-process, or remote -------------------------------------------

    def profile(self, workload: list[WorkloadRequest]) -> dict[str, Any]:
        if self.remote is not None:
            return self.remote.profile(workload)
        return profile_engine(self.engine, workload, concurrency=4)

    def reload(self) -> dict[str, Any]:
        return self.remote.reload_kernels() if self.remote is not None else self.engine.reload_kernels()

    def measure_engine(self) -> Measurement:
        if self.remote is not None:
            return self.remote.measure(prompt_ids(self.reference, self.gate.prompts), self.gate)
        return measure(self.engine, self.gate)

    def measure_reference(self) -> Measurement:
        return measure(self.reference, self.gate)

    def sandbox(self, options: CheckOptions) -> Sandbox:
        key = (options.timing_shape and tuple(sorted(options.timing_shape.items())), options.timing_dtype,
               options.shapes and tuple(tuple(sorted(s.items())) for s in options.shapes))
        if key not in self._sandboxes:
            self._sandboxes[key] = Sandbox(options)
        return self._sandboxes[key]

    def close(self) -> None:
        for sandbox in self._sandboxes.values():
            sandbox.close()
        self._sandboxes.clear()
