"""`agent registry list|show|log|rollback`: inspect and undo what the loop committed."""

from __future__ import annotations

import argparse

from kernels import get_op
from kernels.errors import RegistryError
from kernels.registry import Registry

from agent.render import console, print_json, print_table


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("registry", help="the kernel registry: list, show, log, rollback")
    verbs = p.add_subparsers(dest="verb", required=True, metavar="VERB")

    def verb(name: str, help: str, run) -> argparse.ArgumentParser:
        v = verbs.add_parser(name, help=help)
        v.add_argument("--registry", default=None, metavar="PATH",
                       help="registry repository (default: $KERNELLOOP_REGISTRY or ~/.local/share/kernelloop/registry)")
        v.set_defaults(run=run)
        return v

    v = verb("list", "entries, one per (op, device, dtype, shape bucket)", run_list)
    v.add_argument("--op", default=None)
    v.add_argument("--json", action="store_true")
    v = verb("show", "one entry with its provenance and source", run_show)
    v.add_argument("entry", help="entry id (or a unique prefix)")
    v.add_argument("--json", action="store_true")
    v = verb("log", "the registry's commits, newest first", run_log)
    v.add_argument("--limit", type=int, default=20)
    v = verb("rollback", "undo a commit (or the commit that added an entry) with a revert commit", run_rollback)
    v.add_argument("target", help="entry id or commit sha")


def open_registry(args: argparse.Namespace) -> Registry:
    """An explicit --registry must exist; the default one may not exist yet (nothing added)."""
    reg = Registry(args.registry)
    if args.registry is not None and not reg.path.exists():
        raise RegistryError(f"no registry at {reg.path}")
    return reg


def run_list(args: argparse.Namespace) -> int:
    reg = open_registry(args)
    if args.op:
        get_op(args.op)  # unknown op: one clear line, exit 2
    entries = [e for e in reg.entries() if args.op in (None, e.op)]
    if args.json:
        print_json({"registry": str(reg.path), "entries": [e.to_dict() for e in entries]})
        return 0
    rows = [(e.id, e.op, e.device, e.dtype, e.bucket, f"{e.speedup:.3f}x",
             f"[{e.speedup_ci[0]:.3f}, {e.speedup_ci[1]:.3f}]", e.provenance.proposer, e.verified_at) for e in entries]
    print_table(f"registry {reg.path} ({len(entries)} entries)",
                ("id", "op", "device", "dtype", "bucket", "speedup", "interval", "proposer", "verified"), rows)
    return 0


def run_show(args: argparse.Namespace) -> int:
    reg = open_registry(args)
    entry = reg.find(args.entry)
    source = reg.source(entry)
    if args.json:
        print_json({**entry.to_dict(), "source_text": source})
        return 0
    d = entry.to_dict()
    prov = d.pop("provenance")
    rows = [(k, v) for k, v in d.items()] + [(f"provenance.{k}", v) for k, v in prov.items()]
    print_table(f"registry entry {entry.id}", ("field", "value"), rows)
    console.print(source, markup=False, highlight=False)
    return 0


def run_log(args: argparse.Namespace) -> int:
    reg = open_registry(args)
    rows = [(c.sha[:10], c.date, c.message.splitlines()[0]) for c in reg.history(args.limit)]
    print_table(f"registry {reg.path} history", ("commit", "date", "message"), rows)
    return 0


def run_rollback(args: argparse.Namespace) -> int:
    reg = open_registry(args)
    reg.entries()  # a corrupt registry fails here with one clear line
    commit = reg.rollback(args.target)
    print(f"rolled back: {commit.sha[:10]} {commit.message.splitlines()[0]}")
    return 0
