"""`agent audit --engine URL`: the shadow audit of a serving engine's live traffic (agent/auditor.py).

Re-scores the requests the engine sampled (`engine serve --audit-rate`) with the float32 reference built
here from the engine's model directory, every `--every` seconds until interrupted (or once with `--once`),
and rolls back a registry commit whose audited window breaches a threshold. `agent daemon` runs the same
audit between its tune runs.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from kernelloop.agent.commands.common_args import add_history_argument, add_registry_argument
from kernelloop.common.errors import KernelloopError

DEFAULT_EVERY_S = 30.0


def add_audit_window_argument(p: argparse.ArgumentParser, flag: str = "--window") -> None:
    from kernelloop.agent.shadow_audit import AuditConfig

    p.add_argument(flag, dest="audit_window", type=int,
                   default=AuditConfig.window, metavar="N",
                   help=f"audited requests per registry commit judged together (default {AuditConfig.window}; "
                        f"judged from {AuditConfig.min_samples} on)")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("audit", help="shadow-audit a serving engine's traffic against the float32 reference; "
                                     "roll back a commit that breaches")
    p.add_argument("--engine", required=True, metavar="URL",
                   help="an `engine serve --kernels registry` with --audit-rate above 0, on this machine")
    p.add_argument("--model", default=None, metavar="DIR",
                   help="the model directory the reference is built from (default: the engine's)")
    p.add_argument("--once", action="store_true", help="audit what is queued now, then exit")
    add_audit_window_argument(p)
    p.add_argument("--every", type=float, default=DEFAULT_EVERY_S, metavar="S",
                   help=f"seconds between polls (default {DEFAULT_EVERY_S:g})")
    add_registry_argument(p, "kernel registry (default: the engine's)")
    add_history_argument(p)
    p.set_defaults(run=run)


def build_auditor(url: str, registry: str | Path | None, history: Any, model: str | None, window: int,
                  reload: Any = None) -> Any:
    """An Auditor of the engine at `url`, its reference a float32 in-process engine of the same model;
    `reload`: what reloads after a rollback (a fleet's reload; default the engine at `url`)."""
    from kernelloop.agent.auditor import Auditor, EngineAudit
    from kernelloop.agent.local_engine import LocalEngine
    from kernelloop.agent.shadow_audit import AuditConfig
    from kernelloop.kernels.registry import Registry

    if window < 1:
        raise KernelloopError("the audit window must be at least 1 request")
    source = EngineAudit(url, timeout_s=60)
    model = model or source.health.get("model_dir")
    if not model or not Path(model).is_dir():
        raise KernelloopError(f"the engine's model directory {model!r} is not on this machine; pass --model DIR "
                              "(the audit's float32 reference runs here)")
    reg = Registry(registry or source.health.get("registry"))
    reference = LocalEngine(name="the audit's reference", model=model, device="cpu", kernels="reference",
                            dtype="float32")
    return Auditor(source, reference, reg, history, AuditConfig(window=window, min_samples=min(window, 5)), reload)


def describe(result: Any) -> str:
    """One line per poll: what was scored, each commit's figures, any rollback."""
    def num(value: Any, fmt: str) -> str:
        return "-" if value is None else format(value, fmt)

    parts = [f"scored {result.scored}" + (f", missed {result.missed}" if result.missed else "")]
    parts += [f"{c[:10]}: n={f['samples']} agree={num(f['agreement'], '.3f')} kl={num(f['kl'], '.4f')} "
              f"loops={num(f['loop_rate'], '.0%')}" for c, f in result.figures.items()]
    parts += [f"ROLLED BACK {r['commit'][:10]}: {r['reason']}" for r in result.rolled_back]
    return "; ".join(parts)


def run(args: argparse.Namespace) -> int:
    from kernelloop.history import History

    if args.every <= 0:
        raise KernelloopError("--every must be above 0 seconds")
    with History(args.history) as history:
        auditor = build_auditor(args.engine, args.registry, history, args.model, args.audit_window)
        while True:
            result = auditor.poll()
            if result.scored or result.rolled_back or args.once:
                print(describe(result), flush=True)
            if args.once:
                return 0
            try:
                time.sleep(args.every)
            except KeyboardInterrupt:
                print("agent audit: stopped", file=sys.stderr)
                return 0
