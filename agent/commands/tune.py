"""`agent tune [OP]`: the whole loop once: profile, propose, check, refine, commit, reload, verify.

Without `--engine` it starts the engine on the embedded model in this process; with it, it tunes
that serving engine (profile over HTTP, commit to its registry, POST /kernels/reload, the gate's
measurements taken by the engine through POST /gate/measure). A run that was
killed resumes where it stopped the next time `agent tune` runs for the same op (`--restart`
abandons it instead).

With `--proposer llm` the endpoint at OPENAI_BASE_URL (any OpenAI-compatible server, `engine serve`
included) is checked with GET /models before any other work. The exit status is 0 when the run
finished (winner or not), 1 when the proposers never produced a single candidate (the result line
says why), 2 for bad input or an unusable endpoint.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from kernelloop.agent.commands.common_args import (
    add_tune_arguments,
    build_proposers,
    check_tune_arguments,
    close_proposers,
    gate_config,
    open_pool,
    tune_settings,
)
from kernelloop.agent.render import print_json, print_table
from kernelloop.common.errors import KernelloopError
from kernelloop.kernels.display import safe_text

# torch, the engine, the loop and the history are imported where a command runs: `agent --help` stays fast.


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("tune", help="tune one op end to end: profile, propose, check, commit, reload, verify")
    p.add_argument("op", nargs="?", default=None, help="the op (default: chosen from the profile)")
    add_tune_arguments(p)
    p.add_argument("--restart", action="store_true", help="abandon an unfinished run instead of resuming it")
    p.add_argument("--unfinished", action="store_true",
                   help="list the unfinished (killed) runs, which the next `agent tune` for the same op resumes, and exit")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(run=run)


def engine_target(args: argparse.Namespace) -> tuple[Any, str, str | None, str | None]:
    """(the engine handle to tune, device, registry path, model dir) from --engine/--device/--registry/--model.
    The handle is a RemoteEngine with one --engine, a FleetEngine (agent/fleet.py) with several; None without
    (LoopContext then tunes a LocalEngine)."""
    import torch

    from kernelloop.agent.remote import RemoteEngine
    from kernelloop.kernels.device import CPU, CUDA, resolve_device

    device = resolve_device(args.device)
    if not args.engine:
        return None, device, args.registry, args.model
    if len(args.engine) > 1:
        from kernelloop.agent.fleet import FleetEngine

        remote: Any = FleetEngine.connect(args.engine)
    else:
        remote = RemoteEngine(args.engine[0])
    served = remote.health.get("device", "")
    device = CPU if served == CPU.fingerprint else CUDA
    if not device.interpreted and (not torch.cuda.is_available() or served != device.fingerprint):
        raise KernelloopError(f"{', '.join(args.engine)} runs on {served!r}; candidates must be judged on the same "
                              "device here")
    registry = args.registry or remote.health.get("registry")
    model = args.model or remote.health.get("model_dir")
    if not model or not Path(model).is_dir():
        raise KernelloopError(f"the engine's model directory {model!r} is not on this machine; pass --model DIR "
                              "(the gate's float32 reference runs here)")
    return remote, device, registry, model


def list_unfinished(args: argparse.Namespace) -> int:
    from kernelloop.agent.loop.context import LoopContext
    from kernelloop.agent.loop.graph import checkpointed_op, unfinished_runs
    from kernelloop.history import History
    from kernelloop.kernels.registry import Registry

    with History(args.history) as history:
        ctx = LoopContext(history=history, registry=Registry(args.registry), proposers={})
        runs = [{"id": r["id"], "started_at": r["started_at"], "asked_op": r["op"], "op": checkpointed_op(ctx, r["id"]),
                 "resume_with": f"agent tune {r['op'] or ''}".strip()} for r in unfinished_runs(ctx)]
    if args.json:
        print_json(runs)
    else:
        rows = [(r["id"], r["started_at"], r["asked_op"] or "(from the profile)", r["op"] or "-", r["resume_with"])
                for r in runs]
        print_table(f"{len(rows)} unfinished tune runs (`--restart` abandons one instead)",
                    ("run", "started", "asked for", "op", "resumed by"), rows)
    return 0


def run(args: argparse.Namespace) -> int:
    if args.unfinished:
        return list_unfinished(args)
    from kernelloop.agent.loop.context import LoopContext
    from kernelloop.agent.loop.graph import run_tune, unfinished_run
    from kernelloop.agent.progress_view import ProgressView
    from kernelloop.history import History
    from kernelloop.kernels import get_op
    from kernelloop.kernels.registry import Registry

    if args.op is not None:
        get_op(args.op)
    check_tune_arguments(args)
    proposers = build_proposers(args)
    try:
        remote, device, registry, model = engine_target(args)
        settings = tune_settings(args, device)
        with History(args.history) as history, ProgressView() as progress:  # bars on a terminal, else lines
            ctx = LoopContext(history=history, registry=Registry(registry), proposers=proposers,
                              device=device, model=model, engine=remote,
                              gate=gate_config(args, device), progress=progress,
                              pool=open_pool(args, device, progress))
            try:
                previous = unfinished_run(ctx, args.op)
                if previous is not None and args.restart:
                    history.finish_run(previous, "abandoned", {"reason": "--restart"})
                    previous = None
                state = run_tune(settings, ctx, resume=previous)
            finally:
                ctx.close()
    finally:
        close_proposers(proposers)
    show(state, args.json)
    if state.get("status") == "winner" and not args.json:
        print(serving_hint(state, args, registry, model))
    if state.get("status") == "no-candidate":
        if args.json:  # the result line goes to stdout otherwise
            print(f"agent tune: {safe_text(state.get('reason'))}", file=sys.stderr)
        return 1
    return 0


def serving_hint(state: dict[str, Any], args: argparse.Namespace, registry: str | None, model: str | None) -> str:
    """How to get the committed kernel served: an in-process run's engine is gone when the command ends,
    and `engine serve` on CPU serves reference ops unless told otherwise."""
    entry = state["committed"]["entry_id"]
    metric = f'kernelloop_kernel_variant{{op="{state["op"]}",...,variant="registry:{entry}"}} 1'
    if args.engine:
        return f"{', '.join(args.engine)} serve{'s' if len(args.engine) == 1 else ''} it now (reloaded); /metrics shows {metric}"
    command = " ".join(["engine serve --kernels registry", *(["--registry", str(registry)] if registry else []),
                        *(["--model", str(args.model)] if args.model else [])])
    return f"to serve it: {command} (then /metrics shows {metric} once that shape has run)"


def show(state: dict[str, Any], as_json: bool) -> None:
    from kernelloop.history.queries import PROPOSAL_STAGE

    judged = state.get("judged", [])
    if as_json:
        print_json({k: v for k, v in state.items() if k not in ("pending",)} | {
            "judged": [{k: v for k, v in j.items() if k != "source"} for j in judged],
            "winner": state.get("winner") and {k: v for k, v in state["winner"].items() if k != "source"}})
        return
    rows = [(j["label"], j["proposer"], "ACCEPTED" if j["verdict"]["accepted"] else (j["verdict"]["failure"] or "-"),
             f"{j['verdict']['speedup']:.3f}x" if j["verdict"]["speedup"] else "-", j["verdict"]["reason"])
            for j in judged]
    unjudged = sum(1 for j in judged if j["verdict"].get("stage") == PROPOSAL_STAGE)
    title = f"agent tune {state.get('op', '')}: {len(judged) - unjudged} candidates judged" + (
        f", {unjudged} answers not judged" if unjudged else "")
    print_table(title, ("candidate", "proposer", "verdict", "speedup", "reason"), rows)
    committed = state.get("committed")
    print(f"result: {state.get('status')}: {safe_text(state.get('reason'))}"
          + (f" (registry entry {committed['entry_id']})" if committed and state.get("status") == "winner" else ""))
    tasks = (state.get("gate") or {}).get("tasks")
    if tasks:
        print(f"gate task audit: {safe_text(task_row(tasks))}")


def task_row(tasks: dict[str, Any]) -> str:
    """The gate's task audit in one line (GateResult.tasks): accuracy before -> after, interval, skipped."""
    from kernelloop.agent.task_audit import TaskComparison

    verdict = "FAILED" if tasks["failed"] else "ok"
    return f"{verdict}: {TaskComparison(**tasks).describe()} (tolerance {tasks['tolerance']:g})"
