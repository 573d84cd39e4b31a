"""The bound a timing must respect: the device's copy bandwidth (kernels.timing, cached on disk)."""

from __future__ import annotations

from kernels.timing import cached_copy_bandwidth as copy_bandwidth

ROOFLINE_SLACK = 1.25  # measured copy bandwidth is not quite the peak; allow this much above it

__all__ = ["copy_bandwidth", "ROOFLINE_SLACK"]
