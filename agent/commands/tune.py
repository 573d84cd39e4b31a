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
import os
import sys
from pathlib import Path
from typing import Any

import torch

from agent.gate import GateConfig
from agent.loop.context import LoopContext
from agent.loop.graph import run_tune, unfinished_run
from agent.loop.state import TuneSettings
from agent.proposers.prompts import PROPOSAL_STAGE
from agent.remote import RemoteEngine
from agent.render import print_json, print_table
from history import History
from kernels import get_op
from kernels.device import device_fingerprint
from kernels.errors import KernelloopError
from kernels.registry import Registry


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("tune", help="tune one op end to end: profile, propose, check, commit, reload, verify")
    p.add_argument("op", nargs="?", default=None, help="the op (default: chosen from the profile)")
    p.add_argument("--engine", default=None, metavar="URL",
                   help="tune a running engine (started with --kernels registry, on this machine: the agent commits to its "
                        "registry and builds the gate's reference from its model directory); default: an in-process engine")
    p.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: cuda if available")
    p.add_argument("--model", default=None, metavar="DIR|NAME",
                   help="model directory or a known name (smollm2) (default: the embedded model)")
    p.add_argument("--proposer", choices=("search", "llm", "both"), default="search")
    p.add_argument("--llm-model", default=os.environ.get("KERNELLOOP_LLM_MODEL", "gpt-4o"),
                   help="model name at OPENAI_BASE_URL (default: $KERNELLOOP_LLM_MODEL or gpt-4o)")
    p.add_argument("--llm-max-tokens", type=int, default=8000, metavar="N",
                   help="completion tokens per LLM answer (max_tokens; default 8000)")
    p.add_argument("--llm-timeout", type=float, default=120.0, metavar="S",
                   help="seconds per LLM request before it is retried (default 120)")
    p.add_argument("--rounds", type=int, default=3, help="propose/check rounds at most (default 3)")
    p.add_argument("--candidates", type=int, default=4, help="candidates per proposer per round (default 4)")
    p.add_argument("--min-gain", type=float, default=0.03)
    p.add_argument("--gate-tps-tolerance", type=float, default=GateConfig.tps_tolerance, metavar="F",
                   help="end-to-end gate: tokens/s may drop by this fraction before it counts (default 0.10)")
    p.add_argument("--registry", default=None, metavar="PATH")
    p.add_argument("--history", default=None, metavar="PATH")
    p.add_argument("--restart", action="store_true", help="abandon an unfinished run instead of resuming it")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(run=run)


def _proposers(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if args.proposer in ("search", "both"):
        from agent.proposers.search import SearchProposer

        out["search"] = SearchProposer()
    if args.proposer in ("llm", "both"):
        from agent.proposers.llm import LLMProposer

        if not os.environ.get("OPENAI_BASE_URL") and not os.environ.get("OPENAI_API_KEY"):
            raise KernelloopError("--proposer llm needs OPENAI_BASE_URL (and OPENAI_API_KEY) for an OpenAI-compatible endpoint")
        if getattr(args, "llm_max_tokens", 1) < 1 or getattr(args, "llm_timeout", 1) <= 0:
            raise KernelloopError("--llm-max-tokens must be at least 1 and --llm-timeout positive")
        llm = LLMProposer(model=args.llm_model, max_tokens_per_round=getattr(args, "llm_max_tokens", 8000),
                          timeout_s=getattr(args, "llm_timeout", 120.0))
        try:
            _progress(llm.check_endpoint())  # before any profiling: a dead endpoint is one line, exit 2
        except BaseException:
            llm.close()
            raise
        out["llm"] = llm
    return out


def _close(proposers: dict[str, Any]) -> None:
    for proposer in proposers.values():
        if hasattr(proposer, "close"):
            proposer.close()


def _progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def engine_target(args: argparse.Namespace) -> tuple[RemoteEngine | None, str, str | None, str | None]:
    """(remote engine or None, device, registry path, model dir) from --engine/--device/--registry/--model."""
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if not args.engine:
        return None, device, args.registry, args.model
    remote = RemoteEngine(args.engine)
    served = remote.health.get("device", "")
    device = "cpu" if served == device_fingerprint("cpu") else "cuda"
    if device == "cuda" and (not torch.cuda.is_available() or served != device_fingerprint("cuda")):
        raise KernelloopError(f"{args.engine} runs on {served!r}; candidates must be judged on the same device here")
    registry = args.registry or remote.health.get("registry")
    model = args.model or remote.health.get("model_dir")
    if not model or not Path(model).is_dir():
        raise KernelloopError(f"the engine's model directory {model!r} is not on this machine; pass --model DIR "
                              "(the gate's float32 reference runs here)")
    return remote, device, registry, model


def run(args: argparse.Namespace) -> int:
    if args.op is not None:
        get_op(args.op)
    if args.rounds < 1 or args.candidates < 1:
        raise KernelloopError("--rounds and --candidates must be at least 1")
    proposers = _proposers(args)
    try:
        remote, device, registry, model = engine_target(args)
        settings = TuneSettings(op=args.op, device=device, proposers=tuple(_proposers_names(args)), rounds=args.rounds,
                                candidates=args.candidates, min_gain=args.min_gain)
        with History(args.history) as history:
            ctx = LoopContext(history=history, registry=Registry(registry), proposers=proposers,
                              device=device, model=model, remote=remote,
                              gate=GateConfig(tps_tolerance=args.gate_tps_tolerance), progress=_progress)
            try:
                previous = unfinished_run(ctx, args.op)
                if previous is not None and args.restart:
                    history.finish_run(previous, "abandoned", {"reason": "--restart"})
                    previous = None
                state = run_tune(settings, ctx, resume=previous)
            finally:
                ctx.close()
    finally:
        _close(proposers)
    show(state, args.json)
    if state.get("status") == "no-candidate":
        if args.json:  # the result line goes to stdout otherwise
            print(f"agent tune: {state.get('reason')}", file=sys.stderr)
        return 1
    return 0


def _proposers_names(args: argparse.Namespace) -> list[str]:
    return ["search", "llm"] if args.proposer == "both" else [args.proposer]


def show(state: dict[str, Any], as_json: bool) -> None:
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
    print(f"result: {state.get('status')}: {state.get('reason')}"
          + (f" (registry entry {committed['entry_id']})" if committed and state.get("status") == "winner" else ""))
