"""`python -m kernelloop.engine.embedded [CACHE_ROOT]`: build the embedded model if needed, print its path.

`--build-into DIR` (used by `ensure_embedded_model`): build into the empty directory DIR, print the
build facts as JSON.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from . import build_embedded_model, ensure_embedded_model


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m kernelloop.engine.embedded", description=__doc__)
    parser.add_argument("cache_root", nargs="?", type=Path, help="default: $KERNELLOOP_CACHE or ~/.cache/kernelloop")
    parser.add_argument("--build-into", type=Path, metavar="DIR", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.build_into is not None:
        print(json.dumps(build_embedded_model(args.build_into)))
    else:
        print(ensure_embedded_model(args.cache_root))


if __name__ == "__main__":
    main()
