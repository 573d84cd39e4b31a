"""The bound a timing must respect: a device's copy bandwidth, measured once and cached on disk."""

from __future__ import annotations

import json
import os
import tempfile

from kernels.device import cache_root, device_fingerprint
from kernels.timing import measure_copy_bandwidth

ROOFLINE_SLACK = 1.25  # measured copy bandwidth is not quite the peak; allow this much above it


def copy_bandwidth(device: str) -> float:
    """Bytes/s of a large copy on `device`, cached per device fingerprint in <cache>/bandwidth.json."""
    path = cache_root() / "bandwidth.json"
    key = device_fingerprint(device)
    try:
        cached = json.loads(path.read_text())
    except (OSError, ValueError):
        cached = {}
    if isinstance(cached, dict) and isinstance(cached.get(key), (int, float)):
        return float(cached[key])
    value = measure_copy_bandwidth(device)
    cached = cached if isinstance(cached, dict) else {}
    cached[key] = value
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".bandwidth-")
    with os.fdopen(fd, "w") as f:
        json.dump(cached, f, indent=1)
    os.replace(tmp, path)
    return value
