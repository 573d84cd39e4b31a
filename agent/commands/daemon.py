"""`agent daemon`: the long-running optimisation loop (see agent/daemon.py)."""

from __future__ import annotations

import argparse
import logging

from kernelloop.agent.commands.audit import add_audit_window_argument
from kernelloop.agent.commands.common_args import (
    add_tune_arguments,
    build_proposers,
    check_tune_arguments,
    close_proposers,
    gate_config,
    open_pool,
    tune_settings,
)
from kernelloop.agent.commands.tune import engine_target
from kernelloop.agent.render import SafeFormatter
from kernelloop.common.errors import KernelloopError

log = logging.getLogger("kernelloop.daemon")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("daemon", help="profile, tune, commit, verify, sleep; until SIGTERM or the budget is spent")
    add_tune_arguments(p)
    p.add_argument("--op", default=None, help="tune only this op (default: the profile's best target each run)")
    p.add_argument("--interval", type=float, default=600.0, metavar="S",
                   help="seconds to sleep between runs (default 600)")
    p.add_argument("--max-runs", type=int, default=None, metavar="N", help="stop after this many tune runs")
    p.add_argument("--max-hours", type=float, default=None, metavar="H", help="stop after this long")
    p.add_argument("--metrics-port", type=int, default=9477, help="Prometheus /metrics on 127.0.0.1 (0: any free port; -1: off)")
    p.add_argument("--log-file", default=None, metavar="PATH", help="also log here")
    p.add_argument("--audit-every", type=float, default=60.0, metavar="S",
                   help="with --engine: seconds between shadow-audit polls of the engine's sampled traffic while the "
                        "daemon sleeps (default 60; the engine samples at `engine serve --audit-rate`)")
    add_audit_window_argument(p, "--audit-window")
    p.add_argument("--no-audit", action="store_true", help="do not run the shadow audit")
    p.add_argument("--audit-only", action="store_true",
                   help="run only the shadow audit of --engine (no tuning) until stopped or --max-hours")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.interval < 0 or (args.max_runs is not None and args.max_runs < 1):
        raise KernelloopError("--interval must be >= 0 and --max-runs >= 1")
    if args.audit_every <= 0:
        raise KernelloopError("--audit-every must be above 0 seconds")
    if args.audit_only and (args.no_audit or not args.engine):
        raise KernelloopError("--audit-only audits a running engine: it needs --engine URL and no --no-audit")
    check_tune_arguments(args)
    from kernelloop.agent.progress_view import ProgressView, StderrHandler

    handlers = [StderrHandler()] + ([logging.FileHandler(args.log_file)] if args.log_file else [])  # above any bars
    for handler in handlers:
        handler.setFormatter(SafeFormatter("%(asctime)s %(levelname)s %(message)s"))  # reasons quote candidates
        log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
    from kernelloop.agent.daemon import Daemon, DaemonMetrics, serve_metrics
    from kernelloop.agent.loop.context import LoopContext
    from kernelloop.history import History
    from kernelloop.kernels import get_op
    from kernelloop.kernels.registry import Registry

    if args.op is not None:
        get_op(args.op)
    proposers = build_proposers(args)  # before the engine: a dead LLM endpoint is one line, exit 2
    remote, device, registry, model = engine_target(args)
    settings = tune_settings(args, device)
    metrics = DaemonMetrics()
    server = None
    if args.metrics_port >= 0:
        server = serve_metrics(metrics, args.metrics_port)
        log.info("metrics on http://127.0.0.1:%d/metrics", server.server_address[1])
    try:
        with History(args.history) as history, ProgressView(log.info) as progress:  # bars on a terminal
            ctx = LoopContext(history=history, registry=Registry(registry), proposers=proposers,
                              device=device, model=model, engine=remote,
                              gate=gate_config(args, device), progress=progress,
                              pool=open_pool(args, device, progress) if not args.audit_only else None)
            if ctx.pool is not None:
                metrics.judges = ctx.pool.actors  # per-actor gauges on /metrics
            auditor = None
            if remote is not None and not args.no_audit:
                from kernelloop.agent.commands.audit import build_auditor

                # A fleet's shadow audit reads the first (gate) engine's sampled traffic; a rollback reloads all.
                auditor = build_auditor(args.engine[0], registry, history, model, args.audit_window,
                                        reload=remote.reload if len(args.engine) > 1 else None)
                log.info("shadow audit of %s every %g s (window %d)", args.engine[0], args.audit_every, args.audit_window)
            daemon = Daemon(ctx, settings, interval_s=args.interval, max_runs=args.max_runs,
                            max_seconds=args.max_hours * 3600 if args.max_hours else None, metrics=metrics,
                            auditor=auditor, audit_every_s=args.audit_every, tune=not args.audit_only)
            daemon.install_signal_handlers()
            try:
                finished = daemon.run()
            finally:
                ctx.close()
    finally:
        close_proposers(proposers)
        if server is not None:
            server.shutdown()
    log.info("daemon stopped after %d finished runs", finished)
    return 0
