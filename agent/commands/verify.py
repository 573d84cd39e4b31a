"""`agent verify`: re-judge every registry entry of this device; report (or roll back) regressions.

Exit 0 when every entry still holds (or every regression was rolled back), 1 when a regression
was found and left in place, 2 for usage errors.
"""

from __future__ import annotations

import argparse
import sys

import httpx

from kernelloop.agent.commands.tune_args import add_history_argument, add_registry_argument
from kernelloop.agent.render import print_json, print_table
from kernelloop.agent.verify import verify_registry
from kernelloop.history import History
from kernelloop.kernels.device import resolve_device
from kernelloop.kernels.errors import KernelloopError
from kernelloop.kernels.registry import Registry


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("verify", help="re-judge every registry entry on this device (after a driver/Triton/torch upgrade)")
    p.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: cuda if available")
    p.add_argument("--rollback", action="store_true", help="roll back entries that regressed")
    p.add_argument("--engine", default=None, metavar="URL", help="ask this engine to reload its kernels afterwards")
    add_registry_argument(p)
    add_history_argument(p)
    p.add_argument("--timeout", type=float, default=180.0, help="seconds per entry (default 180)")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    device = resolve_device(args.device)
    registry = Registry(args.registry)
    if args.registry is not None and not registry.path.exists():
        raise KernelloopError(f"registry {registry.path} does not exist")
    with History(args.history) as history:
        rows = verify_registry(registry, history, device, rollback=args.rollback, timeout_s=args.timeout,
                               progress=lambda m: print(m, file=sys.stderr, flush=True))
    if args.engine and any(r["rolled_back"] for r in rows):
        try:
            httpx.post(f"{args.engine.rstrip('/')}/kernels/reload", timeout=30).raise_for_status()
        except httpx.HTTPError as exc:
            raise KernelloopError(f"rolled back, but {args.engine} did not reload its kernels: {exc}") from None
    if args.json:
        print_json([{"entry": r["entry"].id, "ok": r["ok"], "rolled_back": r["rolled_back"], **{
            k: r["verdict"][k] for k in ("correct", "speedup", "speedup_interval", "failure", "reason")}} for r in rows])
    else:
        table = [(r["entry"].id, r["entry"].op, r["entry"].dtype, r["entry"].bucket, f"{r['entry'].speedup:.2f}x",
                  f"{r['verdict']['speedup']:.2f}x" if r["verdict"]["speedup"] else "-",
                  "ok" if r["ok"] else ("ROLLED BACK" if r["rolled_back"] else "REGRESSED"), r["verdict"]["reason"])
                 for r in rows]
        print_table("agent verify", ("entry", "op", "dtype", "bucket", "recorded", "now", "status", "reason"), table)
        if not rows:
            print("no registry entries for this device")
    regressed = [r for r in rows if not r["ok"] and not r["rolled_back"]]
    return 1 if regressed else 0
