"""`RemoteEngine`: an engine handle (agent/engine_handle.py) on a serving engine reached over HTTP.

It profiles through the engine's /profile routes while driving the workload, reloads with
`POST /kernels/reload` and has the engine take the gate's measurement with `POST /gate/measure`
(engine/gate_measure.py, the code a LocalEngine measures with; its float64 rows come back bit for bit).
The engine must serve `--kernels registry` (it would never load a winner otherwise).
"""

from __future__ import annotations

import base64
from typing import Any, Callable

import httpx
import numpy as np
import torch

from kernelloop.agent.gate import Measurement
from kernelloop.agent.gate_config import GateConfig
from kernelloop.common.errors import KernelloopError
from kernelloop.kernels.display import safe_text
from kernelloop.profiler.http import profile_url
from kernelloop.profiler.workload import WorkloadRequest

WIRE_DTYPE = "float64"  # engine/gate_measure.py WIRE_DTYPE: what /gate/measure's log-probabilities are


class RemoteEngine:
    def __init__(self, url: str, timeout_s: float = 300.0) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        try:
            self.health: dict[str, Any] = httpx.get(f"{self.url}/health", timeout=10).json()
        except (httpx.HTTPError, ValueError) as exc:
            raise KernelloopError(f"cannot reach a kernelloop engine at {self.url}: {exc}") from None
        if self.health.get("kernels") != "registry":
            raise KernelloopError(f"{self.url} serves {self.health.get('kernels')} kernels; tuning needs an engine "
                                  "started with --kernels registry (it would never load a winner)")

    def _post(self, path: str, body: dict | None = None) -> dict[str, Any]:
        try:
            response = httpx.post(f"{self.url}{path}", json=body, timeout=self.timeout_s)
        except httpx.HTTPError as exc:
            raise KernelloopError(f"{self.url}{path} failed: {exc}") from None
        try:
            reply = response.json()
        except ValueError:
            reply = None
        if response.is_success and isinstance(reply, dict):
            return reply
        error = reply.get("error") if isinstance(reply, dict) else None
        message = error.get("message") if isinstance(error, dict) else None
        raise KernelloopError(f"{self.url}{path} failed: HTTP {response.status_code}"
                              + (f": {safe_text(str(message))[:300]}" if message else " (not a JSON object)"))

    def profile(self, workload: list[WorkloadRequest],
                progress: Callable[[str], None] = lambda message: None) -> dict[str, Any]:
        return profile_url(self.url, workload, concurrency=4, seconds=self.timeout_s, progress=progress)

    def reload(self, revision: str | None = None) -> dict[str, Any]:
        """The engine re-reads the registry at HEAD (or at commit `revision`); returns what changed."""
        return self._post("/kernels/reload", {"revision": revision} if revision else None).get("changed", {})


    def measure(self, prompt_ids: list[list[int]], config: GateConfig, warmup: bool = True) -> Measurement:
        """The gate's measurement taken by the engine itself (after an untimed warm-up pass if asked)."""
        reply = self._post("/gate/measure", {"prompts": prompt_ids, "max_tokens": config.max_tokens, "warmup": warmup})
        return decode_measurement(reply, self.url)

    def generate(self, prompt_ids: list[list[int]], max_tokens: int, seeds: list[int | None]) -> list[list[int]]:
        """The runaway check's long generations, by the engine (`POST /gate/generate`)."""
        outputs = self._post("/gate/generate", {"prompts": prompt_ids, "max_tokens": max_tokens, "seeds": seeds})
        outputs = outputs.get("outputs")
        if not (isinstance(outputs, list) and len(outputs) == len(prompt_ids)
                and all(isinstance(o, list) and all(isinstance(t, int) for t in o) for o in outputs)):
            raise KernelloopError(f"{self.url}/gate/generate did not send one list of token ids per prompt: update "
                                  "that engine to this version of kernelloop")
        return outputs

    def invariance(self, prompt_ids: list[list[int]], max_tokens: int, batch: int) -> dict[str, Any]:
        """The batch-invariance probe, by the engine beside its traffic (`POST /gate/invariance`)."""
        reply = self._post("/gate/invariance", {"prompts": prompt_ids, "max_tokens": max_tokens, "batch": batch})
        ok = all(isinstance(reply.get(k), list) and len(reply[k]) == len(prompt_ids) for k in ("alone", "batch", "hit"))
        if not ok:
            raise KernelloopError(f"{self.url}/gate/invariance did not send three decodes per prompt: update that "
                                  "engine to this version of kernelloop")
        return reply

    def close(self) -> None:
        """Nothing is held between requests."""


def decode_measurement(reply: dict[str, Any], url: str = "the engine") -> Measurement:
    """A `POST /gate/measure` reply as a Measurement (float64 log-probabilities, as sent)."""
    if reply.get("dtype") != WIRE_DTYPE:
        raise KernelloopError(f"{url}/gate/measure sent {reply.get('dtype', 'float32')} log-probabilities; the gate "
                              f"compares {WIRE_DTYPE} ones: update that engine to this version of kernelloop")
    vocab = reply["vocab"]
    logprobs = [torch.from_numpy(np.frombuffer(base64.b64decode(rows), dtype=np.float64).copy()).reshape(-1, vocab)
                for rows in reply["logprobs"]]
    return Measurement(reply["greedy"], logprobs, reply["tokens_per_second"])
