"""One judge of a cluster: a Ray actor (made from this class by the pool) owning warm Sandboxes.

It holds one Sandbox per distinct options (keyed by their JSON), created on first use and closed when
the actor ends; its fork servers and their children die with it (PR_SET_PDEATHSIG). It judges as the
local judge does (`judge_or_refuse`, the same confinement); what comes in and goes out is data.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kernelloop.kernels.device import Device


class Judge:
    """The actor's class; the pool wraps it with `ray.remote` (num_cpus=1 on cpu, num_gpus=1 on cuda)."""

    def __init__(self, device: Device) -> None:
        if device.interpreted:  # before anything imports Triton: its mode is fixed at decoration time
            os.environ["TRITON_INTERPRET"] = "1"
        self.device = device
        self._sandboxes: dict[str, Any] = {}

    def info(self) -> dict[str, Any]:
        """Where this judge runs: node IP, node id, PID, device fingerprint."""
        import ray

        ctx = ray.get_runtime_context()
        return {"node": ray.util.get_node_ip_address(), "node_id": ctx.get_node_id(), "pid": os.getpid(),
                "device": self.device.fingerprint}

    def judge(self, op: str, source: str, label: str, options: dict[str, Any]) -> dict[str, Any]:
        """The verdict's JSON (Verdict.to_json()), or {"machine_error": line} when this machine cannot
        judge (no confinement, a broken setup): that is not the candidate's doing."""
        from kernelloop.common.errors import KernelloopError
        from kernelloop.sandbox.judge.orchestrator import Sandbox
        from kernelloop.sandbox.options import CheckOptions
        from kernelloop.sandbox.verdict import judge_or_refuse

        key = json.dumps(options, sort_keys=True)
        try:
            sandbox = self._sandboxes.get(key)
            if sandbox is None:
                sandbox = self._sandboxes[key] = Sandbox(CheckOptions.from_json(options))
            return judge_or_refuse(sandbox, op, source, label).to_json()
        except (KernelloopError, OSError) as exc:
            return {"machine_error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]}

    def close(self) -> None:
        for sandbox in self._sandboxes.values():
            sandbox.close()
        self._sandboxes.clear()
