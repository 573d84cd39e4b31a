"""`agent history`: what the loop tried, newest first (candidates with their latest verdict)."""

from __future__ import annotations

import argparse
from pathlib import Path

from kernelloop.agent.commands.common_args import add_history_argument, positive_int
from kernelloop.agent.render import print_json, print_table


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("history", help="attempts the loop made: candidates, verdicts, speedups, rejections")
    p.add_argument("--op", default=None, help="only this op")
    p.add_argument("--limit", type=positive_int, default=50, help="at most this many attempts (default 50)")
    p.add_argument("--search", default=None, metavar="TEXT",
                   help="full-text search over sources and verdict reasons; also matches failure codes, labels and "
                        "verdict words (e.g. timeout, wrong, 'timing incomplete')")
    p.add_argument("--json", action="store_true", help="print a JSON list instead of a table")
    add_history_argument(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from kernelloop.history import History, default_history_path
    from kernelloop.history.queries import attempt_time, outcome
    from kernelloop.kernels import get_op

    path = default_history_path() if args.history is None else Path(args.history).expanduser()
    if not path.exists():  # a read never creates the file
        print(f"no history yet at {path}")
        return 0
    if args.op:
        get_op(args.op)  # unknown op: one clear line, exit 2
    with History(path) as hist:
        rows = hist.attempts(op=args.op, limit=args.limit, search=args.search)
    if args.json:
        print_json(rows)
        return 0
    table = [(attempt_time(r)[:19].replace("T", " "), r["op"], r["proposer"], r["label"] or "",
              (r["sha256"] or "")[:10], outcome(r), "" if r["speedup"] is None else f"{r['speedup']:.3f}x",
              r["failure"] or "", r["reason"] or "") for r in rows]
    what = f" matching {args.search!r}" if args.search else ""
    print_table(f"history {path} ({len(rows)} attempts{what}, newest first; time: of the verdict, else of the proposal)",
                ("time (UTC)", "op", "proposer", "label", "sha256", "verdict", "speedup", "failure", "reason"), table)
    return 0
