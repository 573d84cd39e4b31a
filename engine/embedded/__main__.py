"""`python -m engine.embedded [CACHE_ROOT]`: build (or verify) the embedded model, print its path."""

from __future__ import annotations

import sys
from pathlib import Path

from . import ensure_embedded_model

if __name__ == "__main__":
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else None
    print(ensure_embedded_model(root))
