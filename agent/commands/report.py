"""`agent report`: one self-contained HTML file with the latest profile, what the registry served,
the end-to-end gates, tune runs, accepted kernels and rejections."""

from __future__ import annotations

import argparse
from pathlib import Path

from kernelloop.agent.commands.common_args import add_history_argument
from kernelloop.common.errors import KernelloopError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="write an HTML report: profile, registry, gates, tune runs, rejections")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="folder for kernelloop-report.html (default: $KERNELLOOP_REPORTS or "
                        "~/.local/share/kernelloop/reports)")
    add_history_argument(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from kernelloop.history.db import default_history_path, default_report_dir
    from kernelloop.history.report import write_report  # matplotlib only when a report is asked for

    path = default_history_path() if args.history is None else Path(args.history).expanduser()
    out = default_report_dir() if args.out is None else Path(args.out).expanduser()
    if out.exists() and not out.is_dir():
        raise KernelloopError(f"--out {out} exists and is not a folder")
    try:
        target = write_report(path, out)
    except OSError as exc:
        raise KernelloopError(f"cannot write the report into {out}: {exc.strerror or exc}") from None
    print(target)
    return 0
