"""The live objects a tune run needs (not checkpointed; rebuilt when a run resumes)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from kernelloop.agent.engine_handle import EngineHandle, check_handle
from kernelloop.agent.gate import Measurement, chat_ids, prompt_ids
from kernelloop.agent.gate_config import GateConfig
from kernelloop.agent.local_engine import LocalEngine
from kernelloop.agent.proposers.base import Proposer
from kernelloop.agent.render import throttled
from kernelloop.agent.task_audit import first_wrong
from kernelloop.agent.task_suite import TaskSuite, load_suite
from kernelloop.common.progress import prefixed
from kernelloop.history import History
from kernelloop.kernels.device import CPU, Device
from kernelloop.kernels.registry import Registry
from kernelloop.profiler.workload import WorkloadRequest
from kernelloop.sandbox import CheckOptions, Sandbox

TASK_CHUNK = 16  # task-audit requests sent to the engine at once (POST /gate/generate takes up to 16)


@dataclass
class LoopContext:
    history: History
    registry: Registry
    proposers: dict[str, Proposer]       # name -> proposer (agent/proposers/base.py)
    device: Device = CPU
    model: str | None = None             # model directory; None: the embedded model
    # The engine being tuned (agent/engine_handle.py): a RemoteEngine to tune a serving engine over HTTP;
    # None: a LocalEngine on `model`, `device` and the registry, built on first use.
    engine: EngineHandle = None  # type: ignore[assignment]  # set in __post_init__
    random_weights: bool = False         # a shapes-only model directory (no weights): seeded random weights
    gate: GateConfig = field(default_factory=GateConfig)
    progress: Callable[[str], None] = lambda message: None
    # --cluster: the JudgePool (sandbox/cluster) that judges a round's candidates at once; None: this
    # process's sandboxes, one candidate per check step. Owned here: close() closes it.
    pool: Any = None
    _reference: LocalEngine | None = None
    _prompt_ids: list[list[int]] | None = None
    _reference_measurement: Measurement | None = None
    _tasks: tuple[TaskSuite, list[list[int] | None]] | None = None
    _sandboxes: dict[tuple, Sandbox] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.engine is None:
            self.engine = LocalEngine(model=self.model, device=self.device, kernels="registry",
                                      registry=self.registry, random_weights=self.random_weights,
                                      progress=lambda message: self.progress(message))  # ctx.progress may be replaced
        check_handle(self.engine)

    @property
    def reference(self) -> LocalEngine:
        """The same model (same seeded weights) with float32 torch ops, always in this process: the gate's
        ground truth, and the tokenizer of its prompts. Never captured into CUDA graphs: the reference ops
        sync with the host (decode attention reads lengths)."""
        if self._reference is None:
            self._reference = LocalEngine(model=self.model, device=self.device, kernels="reference",
                                          dtype="float32", cuda_graphs=False, random_weights=self.random_weights,
                                          name="the reference engine", progress=lambda message: self.progress(message))
        return self._reference

    # -- the engine being tuned, through its handle --------------------------------------------

    def profile(self, workload: list[WorkloadRequest]) -> dict[str, Any]:
        return self.engine.profile(workload, self._profile_progress)

    def _profile_progress(self, message: str) -> None:
        self.progress(prefixed("  profile: ", message))  # a Step stays one

    def reload(self, revision: str | None = None) -> dict[str, Any]:
        """Serve the registry's HEAD (or commit `revision`); returns the variants that changed."""
        return self.engine.reload(revision)

    def tokens_per_second_at(self, revision: str, warmup: bool = True) -> float:
        """The engine's gate tokens/s with the registry as commit `revision` holds it."""
        self.reload(revision)
        return self.measure_engine(warmup).tokens_per_second

    def prompt_ids(self) -> list[list[int]]:
        """The gate's prompts as token ids (by the reference's tokenizer: the model's own)."""
        if self._prompt_ids is None:
            self._prompt_ids = prompt_ids(self.reference, self.gate.prompts)
        return self._prompt_ids

    def long_generations(self) -> dict[str, Any] | None:
        """The runaway check's generations by the engine being tuned: {"sampling": labels, "outputs": ids}
        per (prompt, sampling) pair; None when the check is off."""
        g = self.gate
        if g.runaway_tokens <= 0 or not g.runaway_sampling:
            return None
        pairs = [(i, seed) for i in range(min(g.runaway_prompts, len(self.prompt_ids()))) for seed in g.runaway_sampling]
        self.progress(f"end-to-end gate: runaway check, {len(pairs)} generations of up to {g.runaway_tokens} tokens")
        outputs = self.engine.generate([self.prompt_ids()[i] for i, _ in pairs], g.runaway_tokens,
                                       [seed for _, seed in pairs])
        labels = [f"prompt {i}, " + ("greedy" if seed is None else f"seed {seed}") for i, seed in pairs]
        return {"sampling": labels, "outputs": outputs}

    def batch_invariance(self) -> dict[str, Any] | None:
        """The engine's decodes of every gate prompt alone, in a batch and with a prefix-cache hit
        (engine/gate_invariance.py); None when the check is off."""
        g = self.gate
        if g.invariance_tokens <= 0:
            return None
        self.progress(f"end-to-end gate: batch invariance, {len(self.prompt_ids())} prompts alone, in a batch of "
                      f"{g.invariance_batch} and from the prefix cache")
        return self.engine.invariance(self.prompt_ids(), g.invariance_tokens, g.invariance_batch)

    def task_suite(self) -> tuple[TaskSuite, list[list[int] | None]] | None:
        """The task audit's suite and each item's chat-templated prompt ids (by the reference's tokenizer, as
        the engine serves chat requests); None where a prompt is too long for the model (skipped). None when off."""
        if self.gate.tasks == "off":
            return None
        if self._tasks is None:
            suite, limit = load_suite(self.gate.tasks), self.reference.engine.max_model_len
            ids = [chat_ids(self.reference, list(item.messages)) for item in suite.items]
            self._tasks = suite, [p if len(p) < limit else None for p in ids]
        return self._tasks

    def task_audit(self) -> dict[str, Any] | None:
        """The engine's greedy answers to the task suite, checked (agent/task_audit.py): {"suite", "ids",
        "passed" (None: skipped), "wrong" (each item's first wrong field), "skipped"}; None when off."""
        loaded = self.task_suite()
        if loaded is None:
            return None
        suite, ids = loaded
        todo = [i for i, p in enumerate(ids) if p is not None]
        self.progress(f"end-to-end gate: task audit, {len(todo)} items of {suite.name} v{suite.version}"
                      + (f" ({len(ids) - len(todo)} too long, skipped)" if len(todo) < len(ids) else ""))
        texts: list[str | None] = [None] * len(ids)
        for start in range(0, len(todo), TASK_CHUNK):
            chunk = todo[start:start + TASK_CHUNK]
            outputs = self.engine.generate([ids[i] for i in chunk], suite.max_tokens, [None] * len(chunk))
            for i, out in zip(chunk, outputs):
                texts[i] = self.reference.tokenizer.decode(out)
        wrong = [None if t is None else first_wrong(item, t) for item, t in zip(suite.items, texts)]
        return {"suite": f"{suite.name} v{suite.version}", "ids": [item.id for item in suite.items],
                "passed": [None if t is None else w is None for t, w in zip(texts, wrong)], "wrong": wrong,
                "skipped": len(ids) - len(todo)}

    def measure_engine(self, warmup: bool = True) -> Measurement:
        return self.engine.measure(self.prompt_ids(), self.gate, warmup)

    def measure_reference(self) -> Measurement:
        """The reference engine's measurement (deterministic: taken once per context)."""
        if self._reference_measurement is None:
            self._reference_measurement = self.reference.measure(self.prompt_ids(), self.gate)
        return self._reference_measurement

    def sandbox(self, options: CheckOptions) -> Sandbox:
        key = (options.timing_shape and tuple(sorted(options.timing_shape.items())), options.timing_dtype,
               options.shapes and tuple(tuple(sorted(s.items())) for s in options.shapes))
        if key not in self._sandboxes:
            self._sandboxes[key] = Sandbox(options, progress=throttled(self.progress, prefix="    sandbox: "),
                                           registry=self.registry)
        return self._sandboxes[key]

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool = None
        for sandbox in self._sandboxes.values():
            sandbox.close()
        self._sandboxes.clear()
        self.engine.close()
        if self._reference is not None:
            self._reference.close()
