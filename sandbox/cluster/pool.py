"""The head's side: a pool of judge actors, jobs sent as data, verdicts back in the caller's thread.

At most one job per actor at a time (`ray.wait` over the refs in flight). An actor that dies
mid-check is replaced (same index, a new process) and its job judged once more; a job whose judge
died twice gets a `crash` verdict. The timing baseline crosses as data: the head resolves the
registry's choice for the actor's device kind (`judge.timing.registry_baseline`) and sends it in the
options, with no registry path, so a worker never reads the head's files.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from kernelloop.common.progress import Progress
from kernelloop.kernels.device import Device
from kernelloop.sandbox.cluster.actor import Judge
from kernelloop.sandbox.cluster.jobs import ActorInfo, ClusterJob, ClusterUnavailable
from kernelloop.sandbox.cluster.session import connect, import_ray
from kernelloop.sandbox.verdict import Verdict

START_TIMEOUT_S = 180.0  # an actor that cannot be placed (no free CPU/GPU) fails the pool within this


@dataclass
class _Slot:
    """One actor index: its current handle and what the head knows of it."""

    index: int
    handle: Any
    info: dict[str, Any]
    busy: bool = False
    checks: int = 0
    failures: int = 0
    replaced: int = 0


class JudgePool:
    """Judge actors across a Ray cluster (see kernelloop.sandbox.cluster)."""

    def __init__(self, address: str, *, device: Device, workers: int | None = None,
                 progress: Progress | None = None) -> None:
        """Connects and starts the actors: on a GPU device, one actor per GPU in the cluster (num_gpus=1);
        on the CPU interpreter, `workers` actors (default: the cluster's CPU count), num_cpus=1 each."""
        self.device = device
        self.progress = progress or (lambda message: None)
        self._started = connect(address)
        self._ray = import_ray()
        self._slots: list[_Slot] = []
        self._baselines: dict[tuple[str, str, str], tuple[str, str] | None] = {}
        try:
            resources = self._ray.cluster_resources()
            if not device.interpreted:
                count = int(resources.get("GPU", 0))
                if count < 1:
                    raise ClusterUnavailable(f"--cluster with --device {device}: the Ray cluster has no GPU")
            else:
                count = workers or int(resources.get("CPU", 0))
                if count < 1:
                    raise ClusterUnavailable("the Ray cluster has no CPU for a judge")
            self._uid = uuid.uuid4().hex[:8]
            self._remote = self._ray.remote(Judge)
            handles = [self._spawn(i) for i in range(count)]
            infos = self._infos(handles)
            self._slots = [_Slot(i, h, info) for i, (h, info) in enumerate(zip(handles, infos))]
            self.progress(f"cluster: {count} judge(s) on {len({s.info['node_id'] for s in self._slots})} node(s)")
        except BaseException:
            self.close()
            raise

    # -- actors ---------------------------------------------------------------------------------

    def _spawn(self, index: int, generation: int = 0) -> Any:
        resources = {"num_cpus": 1} if self.device.interpreted else {"num_gpus": 1, "num_cpus": 0}
        env = {"TRITON_INTERPRET": "1" if self.device.interpreted else "0"}
        name = f"kernelloop-judge-{self._uid}-{index}" + (f"-r{generation}" if generation else "")
        return self._remote.options(name=name, max_restarts=0, max_task_retries=0,
                                    runtime_env={"env_vars": env}, **resources).remote(self.device)

    def _infos(self, handles: list[Any]) -> list[dict[str, Any]]:
        ray = self._ray
        try:
            return ray.get([h.info.remote() for h in handles], timeout=START_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            raise ClusterUnavailable(f"the Ray cluster could not start {len(handles)} {self.device} judge(s) within "
                                     f"{START_TIMEOUT_S:g} s (not enough free {'CPUs' if self.device.interpreted else 'GPUs'}?)"
                                     ) from None
        except ray.exceptions.RayError as exc:
            raise ClusterUnavailable(f"a judge actor failed to start: {str(exc).strip().splitlines()[0][:200]}") from None

    def _replace(self, slot: _Slot) -> None:
        try:
            self._ray.kill(slot.handle, no_restart=True)
        except Exception:  # noqa: BLE001  (already gone)
            pass
        slot.replaced += 1
        slot.handle = self._spawn(slot.index, slot.replaced)
        slot.info = self._infos([slot.handle])[0]
        slot.busy = False
        self.progress(f"cluster: judge {slot.index} died; replaced (pid {slot.info['pid']} on {slot.info['node']})")

    @property
    def size(self) -> int:
        return len(self._slots)

    def actors(self) -> list[ActorInfo]:
        return [ActorInfo(index=s.index, node=s.info["node"], node_id=s.info["node_id"], pid=s.info["pid"],
                          device=s.info["device"], busy=s.busy, checks=s.checks, failures=s.failures,
                          replaced=s.replaced) for s in self._slots]

    def device_kinds(self) -> list[str]:
        return sorted({s.info["device"] for s in self._slots})

    # -- judging --------------------------------------------------------------------------------

    def _options_for(self, job: ClusterJob, fingerprint: str) -> dict[str, Any]:
        """The job's options as sent: the registry's baseline for the actor's device (its fingerprint, the
        registry's device key) resolved here."""
        options = job.options
        if options.registry_baseline and options.baseline is None:
            key = (job.op, fingerprint, str(options.to_json()))
            if key not in self._baselines:
                from kernelloop.kernels.ops import get_op
                from kernelloop.kernels.registry import Registry
                from kernelloop.sandbox.judge.timing import registry_baseline

                self._baselines[key] = registry_baseline(get_op(job.op), options, Registry(options.registry), fingerprint)
            found = self._baselines[key]
            # No choice in the registry: the op's own kernel, which needs no registry on the worker.
            options = replace(options, baseline=found, registry=None, registry_baseline=found is not None)
        return options.to_json()

    def _send(self, slot: _Slot, job: ClusterJob) -> Any:
        slot.busy = True
        return slot.handle.judge.remote(job.op, job.source, job.label, self._options_for(job, slot.info["device"]))

    def judge(self, jobs: Sequence[ClusterJob],
              on_verdict: Callable[[int, Verdict], None] | None = None) -> list[Verdict]:
        """Judge the jobs concurrently, at most one per actor at a time; `on_verdict(i, v)` is called in
        this thread as each verdict arrives. Returns verdicts in job order, each with `judged_by` set.
        An actor that dies mid-check is replaced and the job judged again once (judged_by.retried);
        a job whose judge dies twice gets a `crash` verdict. A judge that cannot judge on its machine
        (no confinement there) raises ClusterUnavailable."""
        ray = self._ray
        kinds = set(self.device_kinds())
        for job in jobs:
            if job.device_kind is not None and job.device_kind not in kinds:
                raise ClusterUnavailable(f"no judge for device kind {job.device_kind!r} in the cluster "
                                         f"(it has {', '.join(sorted(kinds)) or 'none'})")
        results: list[Verdict | None] = [None] * len(jobs)
        deaths = [0] * len(jobs)
        pending = list(range(len(jobs)))
        in_flight: dict[Any, tuple[_Slot, int]] = {}
        died = (ray.exceptions.RayActorError, getattr(ray.exceptions, "ActorUnavailableError", ray.exceptions.RayActorError))
        try:
            while pending or in_flight:
                for slot in self._slots:
                    if slot.busy:
                        continue
                    i = next((j for j in pending if jobs[j].device_kind in (None, slot.info["device"])), None)
                    if i is not None:
                        pending.remove(i)
                        in_flight[self._send(slot, jobs[i])] = (slot, i)
                self.progress(f"cluster: {len(in_flight)}/{len(jobs)} candidates in flight, "
                              f"{sum(r is not None for r in results)} judged")
                ready, _ = ray.wait(list(in_flight), num_returns=1)
                slot, i = in_flight.pop(ready[0])
                slot.busy = False
                try:
                    data = ray.get(ready[0])
                except died as exc:
                    deaths[i] += 1
                    info = dict(slot.info)
                    self._replace(slot)
                    if deaths[i] < 2:
                        pending.insert(0, i)
                        continue
                    data = self._died_twice(jobs[i], info, exc)
                    slot_info, retried = info, True
                else:
                    if "machine_error" in data:
                        raise ClusterUnavailable(f"judge {slot.index} on {slot.info['node']} cannot judge: "
                                                 f"{data['machine_error']}")
                    slot_info, retried = slot.info, deaths[i] > 0
                verdict = Verdict.from_json(data)
                verdict.judged_by = {"actor": slot.index, "node": slot_info["node"], "node_id": slot_info["node_id"],
                                     "pid": slot_info["pid"], "device": slot_info["device"], "retried": retried}
                slot.checks += 1
                slot.failures += not verdict.correct
                results[i] = verdict
                if on_verdict is not None:
                    on_verdict(i, verdict)
        finally:
            for slot in self._slots:  # a raised run leaves no actor marked busy forever
                slot.busy = False
        return [v for v in results if v is not None]

    def _died_twice(self, job: ClusterJob, info: dict[str, Any], exc: BaseException) -> dict[str, Any]:
        from kernelloop.kernels.display import storable_text
        from kernelloop.kernels.registry.entry import sha256_text

        v = Verdict(op=job.op, device=info["device"], file=job.label, sha256=sha256_text(storable_text(job.source)))
        v.fail("crash", f"the candidate's judge died twice (last on {info['node']}, pid {info['pid']}: "
                        f"{type(exc).__name__}); not retried again")
        return v.to_json()

    def judge_one(self, job: ClusterJob) -> Verdict:
        return self.judge([job])[0]

    def close(self) -> None:
        """Kills the actors (their fork servers and children die with them) and shuts Ray down if
        this pool started it."""
        ray = self._ray if hasattr(self, "_ray") else None
        if ray is not None:
            for slot in self._slots:
                try:
                    ray.kill(slot.handle, no_restart=True)
                except Exception:  # noqa: BLE001  (already gone)
                    pass
        self._slots = []
        if getattr(self, "_started", False) and ray is not None:
            ray.shutdown()
            self._started = False

    def __enter__(self) -> "JudgePool":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

