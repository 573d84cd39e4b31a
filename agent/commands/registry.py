"""`agent registry list|show|log|rollback`: inspect and undo what the loop committed."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from kernelloop.agent.commands.common_args import add_registry_argument
from kernelloop.agent.render import console, print_json, print_table, warn
from kernelloop.common.errors import RegistryError
from kernelloop.kernels.display import safe_text

if TYPE_CHECKING:
    from kernelloop.kernels.registry import Registry


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("registry", help="the kernel registry: list, show, log, rollback")
    verbs = p.add_subparsers(dest="verb", required=True, metavar="VERB")

    def verb(name: str, help: str, run) -> argparse.ArgumentParser:
        v = verbs.add_parser(name, help=help)
        add_registry_argument(v)
        v.set_defaults(run=run)
        return v

    v = verb("list", "entries, one per (op, device, dtype, shape bucket)", run_list)
    v.add_argument("--op", default=None, help="only this op's entries")
    v.add_argument("--json", action="store_true", help="print one JSON document")
    v = verb("show", "one entry with its provenance and source", run_show)
    v.add_argument("entry", help="entry id (or a unique prefix)")
    v.add_argument("--json", action="store_true", help="print one JSON document (with the source and its hash check)")
    v = verb("log", "the registry's commits, newest first", run_log)
    v.add_argument("--limit", type=int, default=20, help="at most this many commits (default 20)")
    v = verb("rollback", "undo a commit (or the commit that added an entry) with a revert commit", run_rollback)
    v.add_argument("target", help="entry id or commit sha")
    v.add_argument("--engine", default=None, metavar="URL",
                   help="a running `engine serve --kernels registry` to reload after the rollback, so it stops "
                        "serving the rolled-back kernel at once")


def open_registry(args: argparse.Namespace) -> Registry:
    """An explicit --registry must exist; the default one may not exist yet (nothing added). Files
    edited by hand and not committed are named on stderr: they are not what is served."""
    from kernelloop.kernels.registry import Registry

    reg = Registry(args.registry)
    if args.registry is not None and not reg.path.exists():
        raise RegistryError(f"no registry at {reg.path}")
    if dirty := reg.uncommitted():
        warn(f"{reg.path} has uncommitted changes ({', '.join(dirty)}); they are not served, this shows the "
             "registry's last commit")
    return reg


def run_list(args: argparse.Namespace) -> int:
    reg = open_registry(args)
    if args.op:
        from kernelloop.kernels import get_op

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
    """Exit 1 when the source does not hash to the manifest's sha256 (the engine refuses to load it)."""
    from kernelloop.kernels.registry.entry import sha256_text

    reg = open_registry(args)
    entry = reg.find(args.entry)
    source = reg.source(entry)
    actual = sha256_text(source)
    intact = actual == entry.sha256
    if args.json:
        print_json({**entry.to_dict(), "source_text": source, "source_sha256": actual, "intact": intact})
    else:
        d = entry.to_dict()
        prov = d.pop("provenance")
        rows = [(k, v) for k, v in d.items()] + [(f"provenance.{k}", v) for k, v in prov.items()]
        print_table(f"registry entry {entry.id}", ("field", "value"), rows)
        console.print(safe_text(source, multiline=True), markup=False, highlight=False)  # Trojan source shows
    if not intact:
        sys.stderr.write(f"error: {entry.id}'s source hashes to {actual[:12]}, not the manifest's "
                         f"{entry.sha256[:12]}: it was altered, and the engine refuses to load it (the baseline serves)\n")
        return 1
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
    print(f"rolled back: {commit.sha[:10]} {safe_text(commit.message.splitlines()[0])}")
    if args.engine:
        from kernelloop.agent.remote import RemoteEngine

        changed = RemoteEngine(args.engine, timeout_s=60).reload()
        shown = "; ".join(f"{op} {where}: {old} -> {new}" for op, c in changed.items() for where, (old, new) in c.items())
        print(f"reloaded {args.engine}: {safe_text(shown) or 'no kernel it serves changed'}")
    else:
        print("a running engine keeps serving the old kernel until it reloads: `agent registry rollback ... "
              "--engine URL`, or POST URL/kernels/reload")
    return 0
