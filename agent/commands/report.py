"""`agent report`: one self-contained HTML file with the latest profile, accepted kernels and rejections."""

from __future__ import annotations

import argparse
from pathlib import Path

from history import default_history_path
from kernels.errors import KernelloopError

from agent.commands.history import add_history_argument


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="write an HTML report: time shares, speedups, roofline, rejections")
    p.add_argument("--out", default="kernelloop-report", metavar="DIR",
                   help="folder for kernelloop-report.html (default: ./kernelloop-report)")
    add_history_argument(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from history.report import write_report  # matplotlib only when a report is asked for

    path = default_history_path() if args.history is None else Path(args.history).expanduser()
    out = Path(args.out).expanduser()
    if out.exists() and not out.is_dir():
        raise KernelloopError(f"--out {out} exists and is not a folder")
    try:
        target = write_report(path, out)
    except OSError as exc:
        raise KernelloopError(f"cannot write the report into {out}: {exc.strerror or exc}") from None
    print(target)
    return 0
