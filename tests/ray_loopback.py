"""`ray start`, kept on loopback: `python -m tests.ray_loopback start ...` (tests/cluster_util.py).

Ray turns a node address of 127.0.0.1 into the machine's routable address; a test machine may send
traffic to no address but loopback, so these processes answer 127.0.0.1 instead
(kernelloop.sandbox.cluster.session.keep_loopback); nothing else changes.
"""

from __future__ import annotations

import sys

from kernelloop.sandbox.cluster.session import keep_loopback

__all__ = ["keep_loopback"]

if __name__ == "__main__":
    keep_loopback()
    from ray.scripts.scripts import main

    sys.argv[0] = "ray"
    sys.exit(main())
