"""Arguments declared once: those `agent tune` and `agent daemon` share (and what they build from
them), and the registry and history paths every command that reads them takes."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from kernelloop.agent.gate import GateConfig
from kernelloop.kernels.errors import KernelloopError


def add_tune_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--engine", default=None, metavar="URL",
                   help="tune a running engine (started with --kernels registry, on this machine: the agent commits to its "
                        "registry and builds the gate's reference from its model directory); default: an in-process engine")
    p.add_argument("--device", choices=("cpu", "cuda"), default=None,
                   help="where candidates are judged and the in-process engine runs (default: cuda if available)")
    p.add_argument("--model", default=None, metavar="DIR|NAME",
                   help="model directory or a known name (smollm2) (default: the embedded model)")
    p.add_argument("--proposer", choices=("search", "llm", "both"), default="search",
                   help="who proposes kernels: the search over kernel shapes, an LLM, or both (default: search)")
    p.add_argument("--llm-model", default=os.environ.get("KERNELLOOP_LLM_MODEL", "gpt-4o"), metavar="M",
                   help="model name at OPENAI_BASE_URL (default: $KERNELLOOP_LLM_MODEL or gpt-4o)")
    p.add_argument("--llm-max-tokens", type=int, default=8000, metavar="N",
                   help="completion tokens per LLM answer (max_tokens; default 8000)")
    p.add_argument("--llm-timeout", type=float, default=120.0, metavar="S",
                   help="seconds per LLM request before it is retried (default 120)")
    p.add_argument("--rounds", type=int, default=3, metavar="N", help="propose/check rounds at most (default 3)")
    p.add_argument("--candidates", type=int, default=4, metavar="N",
                   help="candidates per proposer per round (default 4)")
    p.add_argument("--min-gain", type=float, default=0.03, metavar="G",
                   help="accept a candidate only when its speedup interval's lower bound exceeds 1 + G (default 0.03)")
    p.add_argument("--timeout", type=float, default=None, metavar="S",
                   help="seconds the sandbox may spend on one candidate (default: the sandbox's default for the "
                        "device; the interpreter needs far more than a GPU)")
    p.add_argument("--gate-tps-tolerance", type=float, default=GateConfig.tps_tolerance, metavar="F",
                   help="end-to-end gate: roll back only when the whole interval of tokens/s after/before is below "
                        f"1 - F (default {GateConfig.tps_tolerance})")
    add_registry_argument(p)
    add_history_argument(p)


def add_registry_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--registry", default=None, metavar="PATH",
                   help="kernel registry (default: $KERNELLOOP_REGISTRY or ~/.local/share/kernelloop/registry)")


def add_history_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--history", default=None, metavar="PATH",
                   help="history database (default: $KERNELLOOP_HISTORY or ~/.local/share/kernelloop/history.db)")


def check_tune_arguments(args: argparse.Namespace) -> None:
    if args.rounds < 1 or args.candidates < 1:
        raise KernelloopError("--rounds and --candidates must be at least 1")
    if args.timeout is not None and args.timeout <= 0:
        raise KernelloopError("--timeout must be positive (seconds per candidate)")
    if args.llm_max_tokens < 1 or args.llm_timeout <= 0:
        raise KernelloopError("--llm-max-tokens must be at least 1 and --llm-timeout positive")


def proposer_names(args: argparse.Namespace) -> list[str]:
    return ["search", "llm"] if args.proposer == "both" else [args.proposer]


def build_proposers(args: argparse.Namespace) -> dict[str, Any]:
    """The proposers asked for; an LLM endpoint is checked (GET /models) before any other work."""
    out: dict[str, Any] = {}
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


def close_proposers(proposers: dict[str, Any]) -> None:
    for proposer in proposers.values():
        if hasattr(proposer, "close"):
            proposer.close()
