"""Where kernelloop keeps its files, resolved in one place.

- data: what must not be lost (the registry, the history, reports): $XDG_DATA_HOME/kernelloop, else
  ~/.local/share/kernelloop; each has its own variable ($KERNELLOOP_REGISTRY, $KERNELLOOP_HISTORY,
  $KERNELLOOP_REPORTS) naming its path directly.
- cache: what can be rebuilt (models, roofline peaks): $KERNELLOOP_CACHE, else ~/.cache/kernelloop.
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    env = os.environ.get("KERNELLOOP_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "kernelloop"


def data_root() -> Path:
    return Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share") / "kernelloop"


def data_path(variable: str, name: str) -> Path:
    """$`variable` when set, else `name` under data_root()."""
    if env := os.environ.get(variable):
        return Path(env).expanduser()
    return data_root() / name
