"""The live objects a tune run needs (not checkpointed; rebuilt when a run resumes)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from kernelloop.agent.gate import GateConfig, Measurement, measure, prompt_ids
from kernelloop.agent.remote import RemoteEngine
from kernelloop.agent.render import throttled
from kernelloop.engine.engine import Engine, EngineConfig
from kernelloop.profiler.inprocess import profile_engine
from kernelloop.profiler.workload import WorkloadRequest
from kernelloop.history import History
from kernelloop.kernels.registry import Registry
from kernelloop.sandbox import CheckOptions, Sandbox


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
    _reference_measurement: Measurement | None = None
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
            return self.remote.profile(workload, self._profile_progress)
        return profile_engine(self.engine, workload, concurrency=4, progress=self._profile_progress)

    def _profile_progress(self, message: str) -> None:
        self.progress(f"  profile: {message}")

    def reload(self, revision: str | None = None) -> dict[str, Any]:
        """Serve the registry's HEAD (or commit `revision`); returns the variants that changed."""
        if self.remote is not None:
            return self.remote.reload_kernels(revision)
        return self.engine.reload_kernels(revision)

    def tokens_per_second_at(self, revision: str, warmup: bool = True) -> float:
        """The engine's gate tokens/s with the registry as commit `revision` holds it."""
        self.reload(revision)
        return self.measure_engine(warmup).tokens_per_second

    def measure_engine(self, warmup: bool = True) -> Measurement:
        if self.remote is not None:
            return self.remote.measure(prompt_ids(self.reference, self.gate.prompts), self.gate, warmup)
        return measure(self.engine, self.gate, warmup)

    def measure_reference(self) -> Measurement:
        """The reference engine's measurement (deterministic: taken once per context)."""
        if self._reference_measurement is None:
            self._reference_measurement = measure(self.reference, self.gate)
        return self._reference_measurement

    def sandbox(self, options: CheckOptions) -> Sandbox:
        key = (options.timing_shape and tuple(sorted(options.timing_shape.items())), options.timing_dtype,
               options.shapes and tuple(tuple(sorted(s.items())) for s in options.shapes))
        if key not in self._sandboxes:
            self._sandboxes[key] = Sandbox(options, progress=throttled(self.progress, prefix="    sandbox: "))
        return self._sandboxes[key]

    def close(self) -> None:
        for sandbox in self._sandboxes.values():
            sandbox.close()
        self._sandboxes.clear()
