"""The judge as Ray actors: candidates checked on every device of a cluster.

    from kernelloop.sandbox.cluster import ClusterJob, JudgePool
    with JudgePool("auto", device=CPU, workers=2) as pool:
        verdicts = pool.judge([ClusterJob("rmsnorm", source, "cand.py", options)])

One actor per GPU (or per CPU core allotted) owns warm Sandboxes for its lifetime (actor.py); the
pool on the head sends jobs as data (op, source text, label, options as JSON), at most one per actor
at a time, and rebuilds typed verdicts (pool.py). Importing this package imports neither ray nor
torch: the command line stays fast; ray is imported when a pool connects (session.py).
"""

from typing import Any

from kernelloop.sandbox.cluster.jobs import ActorInfo, ClusterJob, ClusterUnavailable
from kernelloop.sandbox.cluster.session import connect

_EXPORTS = {"JudgePool": "pool"}
__all__ = ["ActorInfo", "ClusterJob", "ClusterUnavailable", "connect", *_EXPORTS]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        from importlib import import_module

        return getattr(import_module(f"kernelloop.sandbox.cluster.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
