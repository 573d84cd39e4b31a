"""The engine being tuned, as the tune loop sees it: one handle, whether the engine runs here or serves elsewhere.

An `EngineHandle` does six things:

    profile(workload, progress) -> profile dict   drive the workload through the engine and profile it
                                                  (kernelloop/common/profile_contract.py `Profile`)
    reload(revision)            -> changed        serve the registry at HEAD (revision None) or as commit
                                                  `revision` holds it; returns the variants that changed,
                                                  {op: {"dtype bucket": [old, new]}}
    measure(prompt_ids, config, warmup) -> Measurement
                                                  the gate's greedy decode of `prompt_ids` (config.max_tokens
                                                  each) with float64 log-probabilities at every position and
                                                  tokens/s, after an untimed warm-up pass unless `warmup` is false
    generate(prompt_ids, max_tokens, seeds) -> token ids
                                                  the runaway check's long generations: greedy where
                                                  seeds[i] is None, sampled from seeds[i] otherwise
    invariance(prompt_ids, max_tokens, batch) -> {"alone", "batch", "hit", "cached"}
                                                  each prompt's greedy tokens alone, in a batch of `batch`
                                                  requests and with a prefix-cache hit
    close()                                       release what the handle holds (idempotent)

Two implementations: `LocalEngine` (agent/local_engine.py: an Engine in this process, built on first use; the
one agent module that imports the engine) and `RemoteEngine` (agent/remote.py: a serving engine over HTTP,
`POST /kernels/reload` and `POST /gate/measure`, `/gate/generate`, `/gate/invariance`). Both take their measurement with engine/gate_measure.py,
so the two paths give the same figures. `FleetEngine` (agent/fleet.py, `--engine` repeated) is a handle over
several RemoteEngines: profiles merged, reloads to all, the gate on the first. The tune loop
(agent/loop/context.py) holds one handle and never asks which kind it is.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from kernelloop.agent.gate import Measurement
from kernelloop.agent.gate_config import GateConfig
from kernelloop.common.progress import Progress
from kernelloop.profiler.workload import WorkloadRequest

METHODS = ("profile", "reload", "measure", "generate", "invariance", "close")


@runtime_checkable
class EngineHandle(Protocol):
    def profile(self, workload: list[WorkloadRequest], progress: Progress = ...) -> dict[str, Any]:
        """Drive `workload` through the engine and return its profile."""

    def reload(self, revision: str | None = None) -> dict[str, Any]:
        """Serve the registry's HEAD (or commit `revision`); returns the variants that changed."""

    def measure(self, prompt_ids: list[list[int]], config: GateConfig, warmup: bool = True) -> Measurement:
        """The gate's measurement of the engine on these prompts."""

    def generate(self, prompt_ids: list[list[int]], max_tokens: int, seeds: list[int | None]) -> list[list[int]]:
        """Long generations (engine/gate_measure.py long_params): greedy where a seed is None."""

    def invariance(self, prompt_ids: list[list[int]], max_tokens: int, batch: int) -> dict[str, Any]:
        """Each prompt decoded greedily alone, in a batch and with a prefix-cache hit (engine/gate_invariance.py)."""

    def close(self) -> None:
        """Release the engine (or the connection); safe to call twice."""


def check_handle(handle: Any) -> EngineHandle:
    """`handle` itself when it has the four methods; TypeError naming what it lacks otherwise."""
    missing = [name for name in METHODS if not callable(getattr(handle, name, None))]
    if missing:
        raise TypeError(f"{type(handle).__name__} is not an engine handle (agent/engine_handle.py): "
                        f"it lacks {', '.join(missing)}")
    return handle
