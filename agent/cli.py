"""`agent`: kernelloop's command line. Bad input gives one line on stderr and exit 2."""

from __future__ import annotations

import argparse
import logging
import sys

from kernelloop.agent.commands import (
    audit,
    check,
    daemon,
    history,
    ops,
    pr,
    profile,
    quantize,
    registry,
    report,
    tune,
    verify,
)
from kernelloop.common.errors import KernelloopError
from kernelloop.kernels.display import safe_text

COMMANDS = (ops, check, profile, tune, quantize, daemon, audit, verify, pr, registry, history, report)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="agent", description="kernelloop: a self-optimizing kernel loop for LLM inference")
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug output to stderr")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        command.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        return args.run(args)
    except KernelloopError as exc:
        print(f"agent {args.command}: {safe_text(exc)}", file=sys.stderr)  # may name a candidate's file
        return 2
    except KeyboardInterrupt:
        print(f"agent {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
