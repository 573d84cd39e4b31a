"""`agent daemon`: the long-running optimisation loop (see agent/daemon.py)."""

from __future__ import annotations

import argparse
import logging
import sys

from agent.commands.tune import _proposers, engine_target
from agent.daemon import Daemon, DaemonMetrics, serve_metrics
from agent.gate import GateConfig
from agent.loop.context import LoopContext
from agent.loop.state import TuneSettings
from history import History
from kernels.errors import KernelloopError
from kernels.registry import Registry

log = logging.getLogger("kernelloop.daemon")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("daemon", help="profile, tune, commit, verify, sleep; until SIGTERM or the budget is spent")
    p.add_argument("--engine", default=None, metavar="URL", help="tune this running engine (see agent tune --help)")
    p.add_argument("--op", default=None, help="tune only this op (default: the profile's best target each run)")
    p.add_argument("--interval", type=float, default=600.0, help="seconds to sleep between runs (default 600)")
    p.add_argument("--max-runs", type=int, default=None, help="stop after this many tune runs")
    p.add_argument("--max-hours", type=float, default=None, help="stop after this long")
    p.add_argument("--device", choices=("cpu", "cuda"), default=None)
    p.add_argument("--model", default=None, metavar="DIR|NAME", help="model directory or a known name (smollm2)")
    p.add_argument("--proposer", choices=("search", "llm", "both"), default="search")
    p.add_argument("--llm-model", default="gpt-4o")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--candidates", type=int, default=4)
    p.add_argument("--registry", default=None, metavar="PATH")
    p.add_argument("--history", default=None, metavar="PATH")
    p.add_argument("--metrics-port", type=int, default=9477, help="Prometheus /metrics on 127.0.0.1 (0: any free port; -1: off)")
    p.add_argument("--log-file", default=None, metavar="PATH", help="also log here")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.interval < 0 or (args.max_runs is not None and args.max_runs < 1):
        raise KernelloopError("--interval must be >= 0 and --max-runs >= 1")
    handlers = [logging.StreamHandler(sys.stderr)] + ([logging.FileHandler(args.log_file)] if args.log_file else [])
    for handler in handlers:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
    if args.op is not None:
        from kernels import get_op

        get_op(args.op)
    remote, device, registry, model = engine_target(args)
    settings = TuneSettings(op=args.op, device=device, rounds=args.rounds, candidates=args.candidates)
    metrics = DaemonMetrics()
    server = None
    if args.metrics_port >= 0:
        server = serve_metrics(metrics, args.metrics_port)
        log.info("metrics on http://127.0.0.1:%d/metrics", server.server_address[1])
    try:
        with History(args.history) as history:
            ctx = LoopContext(history=history, registry=Registry(registry), proposers=_proposers(args),
                              device=device, model=model, remote=remote, gate=GateConfig(), progress=log.info)
            daemon = Daemon(ctx, settings, interval_s=args.interval, max_runs=args.max_runs,
                            max_seconds=args.max_hours * 3600 if args.max_hours else None, metrics=metrics)
            daemon.install_signal_handlers()
            try:
                finished = daemon.run()
            finally:
                ctx.close()
    finally:
        if server is not None:
            server.shutdown()
    log.info("daemon stopped after %d finished runs", finished)
    return 0
