"""`agent verify`: re-judge every registry entry of this device; report (or roll back) regressions.

Exit 0 when every entry still holds (or every regression was rolled back), 1 when a regression
was found and left in place, 2 for usage errors.
"""

from __future__ import annotations

import argparse
import sys

from kernelloop.agent.commands.common_args import (
    add_cluster_arguments,
    add_device_argument,
    add_history_argument,
    add_registry_argument,
    add_timeout_argument,
    check_timeout_argument,
    open_pool,
)
from kernelloop.agent.render import print_json, print_table
from kernelloop.common.errors import KernelloopError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("verify", help="re-judge every registry entry on this device (after a driver/Triton/torch upgrade)")
    add_device_argument(p, "where the entries are re-judged")
    p.add_argument("--rollback", action="store_true", help="roll back entries that regressed")
    p.add_argument("--engine", default=None, metavar="URL", help="ask this engine to reload its kernels afterwards")
    add_registry_argument(p)
    add_history_argument(p)
    add_timeout_argument(p, "one entry")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    add_cluster_arguments(p)  # --cluster: every entry on every device kind the cluster has, reported per kind
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from kernelloop.agent.remote import RemoteEngine
    from kernelloop.agent.verify import verify_registry
    from kernelloop.history import History
    from kernelloop.kernels.device import resolve_device
    from kernelloop.kernels.registry import Registry

    check_timeout_argument(args)
    device = resolve_device(args.device)
    registry = Registry(args.registry)
    if args.registry is not None and not registry.path.exists():
        raise KernelloopError(f"registry {registry.path} does not exist")
    progress = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    pool = open_pool(args, device, progress)
    try:
        with History(args.history) as history:
            results = verify_registry(registry, history, device, rollback=args.rollback, timeout_s=args.timeout,
                                      progress=progress, pool=pool)
    finally:
        if pool is not None:
            pool.close()
    if args.engine and any(r.rolled_back for r in results):
        try:
            RemoteEngine(args.engine, timeout_s=60).reload()
        except KernelloopError as exc:
            raise KernelloopError(f"rolled back, but {args.engine} did not reload its kernels: {exc}") from None
    if args.json:
        print_json([r.to_json() for r in results])
    else:
        kinds = pool is not None  # a column: the device kind each entry was judged on
        table = [(r.entry.id, r.entry.op, r.entry.dtype, r.entry.bucket, *((r.device,) if kinds else ()),
                  f"{r.entry.speedup:.2f}x", f"{r.verdict.speedup:.2f}x" if r.verdict.speedup else "-",
                  "ok" if r.ok else ("ROLLED BACK" if r.rolled_back else "REGRESSED" if r.own_kind else "refused here"),
                  r.verdict.reason) for r in results]
        print_table("agent verify", ("entry", "op", "dtype", "bucket", *(("judged on",) if kinds else ()), "recorded",
                                     "now", "status", "reason"), table)
        if not results:
            print("no registry entries for this device")
    return 1 if any(r.regressed for r in results) else 0
