"""Arguments declared once, with their defaults taken from the settings they fill: the device, registry,
history, timeout and min-gain arguments several commands take, and the arguments `agent tune` and
`agent daemon` share (and what they build from them).

Only light modules are imported here: `agent --help` must not load torch or Triton."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any, Callable

from kernelloop.agent.gate_config import GateConfig
from kernelloop.agent.loop.state import TuneSettings
from kernelloop.agent.proposers.base import Proposer
from kernelloop.common.errors import KernelloopError
from kernelloop.kernels.device import DEVICES, Device
from kernelloop.sandbox.options import CheckOptions

CPU_RUNAWAY_TOKENS = 32  # the runaway check's default on the CPU interpreter (GPU: GateConfig's 256)
CPU_INVARIANCE_TOKENS = 4  # the batch-invariance check's default there (GPU: GateConfig's 16)
CUDA_TASKS = "agent-v1"  # the task audit's default suite on cuda (cpu: off)


def add_tune_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--engine", action="append", default=None, metavar="URL",
                   help="tune a running engine (started with --kernels registry, on this machine: the agent commits to its "
                        "registry and builds the gate's reference from its model directory); default: an in-process engine. "
                        "Repeat it to tune a fleet serving the same model and registry: their profiles are merged, weighted "
                        "by served tokens, every engine reloads, the gate runs on the first")
    add_device_argument(p, "where candidates are judged and the in-process engine runs")
    p.add_argument("--model", default=None, metavar="DIR|NAME",
                   help="model directory or a known name (smollm2) (default: the embedded model)")
    p.add_argument("--proposer", choices=("search", "llm", "both"), default="search",
                   help="who proposes kernels: the search over kernel shapes, an LLM, or both (default: search)")
    p.add_argument("--batch-invariant", action="store_true",
                   help="commit only a winner the sandbox proved batch invariant (its rows' bits do not depend on the "
                        "batch), so `engine serve --deterministic` can serve it; the proposers aim for it")
    p.add_argument("--llm-model", default=os.environ.get("KERNELLOOP_LLM_MODEL", "gpt-4o"), metavar="M",
                   help="model name at OPENAI_BASE_URL (default: $KERNELLOOP_LLM_MODEL or gpt-4o)")
    p.add_argument("--llm-max-tokens", type=int, default=8000, metavar="N",
                   help="completion tokens per LLM answer (max_tokens; default 8000)")
    p.add_argument("--llm-timeout", type=float, default=120.0, metavar="S",
                   help="seconds per LLM request before it is retried (default 120)")
    p.add_argument("--rounds", type=int, default=TuneSettings.rounds, metavar="N",
                   help=f"propose/check rounds at most (default {TuneSettings.rounds})")
    p.add_argument("--candidates", type=int, default=TuneSettings.candidates, metavar="N",
                   help=f"candidates per proposer per round (default {TuneSettings.candidates})")
    add_min_gain_argument(p)
    add_timeout_argument(p, "one candidate")
    p.add_argument("--gate-tps-tolerance", type=float, default=GateConfig.tps_tolerance, metavar="F",
                   help="end-to-end gate: roll back only when the whole interval of tokens/s after/before is below "
                        f"1 - F (default {GateConfig.tps_tolerance})")
    p.add_argument("--gate-runaway-tokens", type=int, default=None, metavar="N",
                   help="end-to-end gate: tokens per long generation in the runaway check (greedy and seeded "
                        f"sampling, before and after; 0 turns it off; default {GateConfig.runaway_tokens} on cuda, "
                        f"{CPU_RUNAWAY_TOKENS} on cpu, where each interpreted decode step takes about a second)")
    p.add_argument("--gate-invariance-tokens", type=int, default=None, metavar="N",
                   help="end-to-end gate: greedy tokens per prompt decoded alone, in a batch of "
                        f"{GateConfig.invariance_batch} and from the prefix cache, before and after (0 turns it off; "
                        f"default {GateConfig.invariance_tokens} on cuda, {CPU_INVARIANCE_TOKENS} on cpu)")
    p.add_argument("--gate-tasks", default=None, metavar="SUITE|FILE|off",
                   help="end-to-end gate: the task audit's suite (agent-shaped tasks answered greedily before and after: "
                        "JSON, tool calls, a 15-step trace), a bundled name or a JSONL file; off turns it off (default "
                        "agent-v1 on cuda, off on cpu, where it takes minutes on a real model)")
    p.add_argument("--gate-task-tolerance", type=float, default=GateConfig.task_tolerance, metavar="F",
                   help="end-to-end gate: roll back only when the whole interval of task accuracy after/before is below "
                        f"1 - F (default {GateConfig.task_tolerance})")
    add_registry_argument(p)
    add_history_argument(p)
    add_cluster_arguments(p)


def add_cluster_arguments(p: argparse.ArgumentParser) -> None:
    """--cluster and --cluster-workers, for every command that judges (check, tune, daemon, verify)."""
    p.add_argument("--cluster", default=None, metavar="ADDRESS",
                   help="judge on a Ray cluster (pip install 'kernelloop[ray]'): auto (the cluster running on this "
                        "machine, else a local one), or host:port / ray://host:port of an existing one; one judge "
                        "per GPU, or per --cluster-workers core on cpu (default: judge here, in this process's sandbox)")
    p.add_argument("--cluster-workers", type=positive_int, default=None, metavar="N",
                   help="with --cluster on cpu: judges to start (default: the cluster's CPU count)")


def open_pool(args: argparse.Namespace, device: Device, progress: Callable[[str], None] | None = None) -> Any:
    """The JudgePool (sandbox/cluster) that --cluster asks for, or None without it. Missing Ray or an
    unreachable cluster raises ClusterUnavailable (a KernelloopError: one line, exit 2)."""
    if not getattr(args, "cluster", None):
        if getattr(args, "cluster_workers", None) is not None:
            raise KernelloopError("--cluster-workers needs --cluster ADDRESS")
        return None
    from kernelloop.sandbox.cluster import JudgePool

    return JudgePool(args.cluster, device=device, workers=args.cluster_workers, progress=progress)


def positive_int(text: str) -> int:
    """An argparse type: an integer of at least 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def add_device_argument(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--device", choices=DEVICES, default=None, help=f"{what} (default: cuda if available)")


def add_min_gain_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--min-gain", type=float, default=CheckOptions.min_gain, metavar="G",
                   help="accept a candidate only when its speedup interval's lower bound exceeds 1 + G "
                        f"(default {CheckOptions.min_gain})")


def add_timeout_argument(p: argparse.ArgumentParser, per: str) -> None:
    defaults = ", ".join(f"{d.judge_timeout_s:g} on {kind}" for kind, d in DEVICES.items())
    p.add_argument("--timeout", type=float, default=None, metavar="S",
                   help=f"seconds the sandbox may spend on {per}, shared by correctness and timing (default: {defaults}; "
                        "the interpreter needs far more than a GPU)")


def add_registry_argument(p: argparse.ArgumentParser, what: str = "kernel registry") -> None:
    p.add_argument("--registry", type=Path, default=None, metavar="PATH",
                   help=f"{what} (default: $KERNELLOOP_REGISTRY or ~/.local/share/kernelloop/registry)")


def add_history_argument(p: argparse.ArgumentParser, what: str = "history database") -> None:
    p.add_argument("--history", type=Path, default=None, metavar="PATH",
                   help=f"{what} (default: $KERNELLOOP_HISTORY or ~/.local/share/kernelloop/history.db)")


def check_tune_arguments(args: argparse.Namespace) -> None:
    if args.rounds < 1 or args.candidates < 1:
        raise KernelloopError("--rounds and --candidates must be at least 1")
    check_timeout_argument(args)
    if args.llm_max_tokens < 1 or args.llm_timeout <= 0:
        raise KernelloopError("--llm-max-tokens must be at least 1 and --llm-timeout positive")


def check_timeout_argument(args: argparse.Namespace) -> None:
    if args.timeout is not None and args.timeout <= 0:
        raise KernelloopError("--timeout must be positive (seconds)")


def tune_settings(args: argparse.Namespace, device: Device) -> TuneSettings:
    return TuneSettings(op=args.op, device=device, rounds=args.rounds, candidates=args.candidates,
                        min_gain=args.min_gain, sandbox_timeout_s=args.timeout,
                        batch_invariant=getattr(args, "batch_invariant", False))


def gate_config(args: argparse.Namespace, device: Device) -> GateConfig:
    tokens = args.gate_runaway_tokens
    if tokens is None:
        tokens = CPU_RUNAWAY_TOKENS if device.interpreted else GateConfig.runaway_tokens
    if not 0 <= tokens <= 1024:
        raise KernelloopError("--gate-runaway-tokens must be 0 (off) or a number of tokens up to 1024")
    invariance = args.gate_invariance_tokens
    if invariance is None:
        invariance = CPU_INVARIANCE_TOKENS if device.interpreted else GateConfig.invariance_tokens
    if not 0 <= invariance <= 64:
        raise KernelloopError("--gate-invariance-tokens must be 0 (off) or a number of tokens up to 64")
    tasks = args.gate_tasks or ("off" if device.interpreted else CUDA_TASKS)
    if tasks != "off":
        from kernelloop.agent.task_suite import load_suite

        load_suite(tasks)  # a bad suite is a one-line error now, not after the search
    if not 0 <= args.gate_task_tolerance < 1:
        raise KernelloopError("--gate-task-tolerance must be from 0 to below 1")
    return GateConfig(tps_tolerance=args.gate_tps_tolerance, runaway_tokens=tokens, invariance_tokens=invariance,
                      tasks=tasks, task_tolerance=args.gate_task_tolerance)


def build_proposers(args: argparse.Namespace) -> dict[str, Proposer]:
    """The proposers asked for; an LLM endpoint is checked (GET /models) before any other work."""
    out: dict[str, Proposer] = {}
    if args.proposer in ("search", "both"):
        from kernelloop.agent.proposers.search import SearchProposer

        out["search"] = SearchProposer()
    if args.proposer in ("llm", "both"):
        from kernelloop.agent.proposers.llm import LLMProposer

        if not os.environ.get("OPENAI_BASE_URL") and not os.environ.get("OPENAI_API_KEY"):
            raise KernelloopError("--proposer llm needs OPENAI_BASE_URL (and OPENAI_API_KEY) for an OpenAI-compatible endpoint")
        llm = LLMProposer(model=args.llm_model, max_tokens_per_round=args.llm_max_tokens, timeout_s=args.llm_timeout)
        try:
            print(llm.check_endpoint(), file=sys.stderr, flush=True)  # a dead endpoint: one line, exit 2
        except BaseException:
            llm.close()
            raise
        out["llm"] = llm
    return out


def close_proposers(proposers: dict[str, Proposer]) -> None:
    """Close every proposer (the Proposer protocol's `close()`)."""
    for proposer in proposers.values():
        proposer.close()
