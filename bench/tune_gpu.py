"""`agent tune` on the GPU: `python -m bench.tune_gpu [--ops rmsnorm,silu_mul] [--out-dir DIR]`.

For each op, the whole loop runs in-process with the search proposer on a Llama-3-8B-shaped model
with random bf16 weights (no download): profile, propose, sandbox, commit, reload, end-to-end gate.
The table: the op's hottest bucket, the baseline's and the winner's time per call and percent of
copy bandwidth (from the winner's verdict), the accepted speedup, and end-to-end tokens/s before and
after (from the gate). A temporary registry and history are used: nothing outside the run changes.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

import kernels  # noqa: F401  (configures Triton)
from agent.gate import GATE_PROMPTS, GateConfig
from agent.loop.context import LoopContext
from agent.loop.graph import run_tune
from agent.loop.state import TuneSettings
from agent.proposers.search import SearchProposer
from bench.engine_gpu import LLAMA3_8B, write_model_dir
from bench.profile_gpu import CHAT_TEMPLATE
from bench.report import print_table, write_report
from history import History
from kernels.registry import Registry


def _row(op: str, state: dict) -> dict:
    winner = state.get("winner") or {}
    timing = (winner.get("verdict") or {}).get("timing") or {}
    gate = state.get("gate") or {}
    bw = timing.get("copy_bandwidth_bytes_per_s")
    base_s, cand_s = timing.get("baseline_s"), timing.get("candidate_s")
    moved = timing.get("achieved_bytes_per_s", 0.0) * cand_s if cand_s else 0.0  # bytes one call must move

    def pct(seconds: float | None) -> str:
        return f"{100 * moved / seconds / bw:.1f}" if moved and seconds and bw else "-"

    return {
        "op": op, "bucket": f"{state.get('dtype', '')} {state.get('bucket', '')}", "result": state.get("status"),
        "winner": winner.get("label", "-"), "baseline us": f"{base_s * 1e6:.1f}" if base_s else "-",
        "winner us": f"{cand_s * 1e6:.1f}" if cand_s else "-", "baseline % bw": pct(base_s), "winner % bw": pct(cand_s),
        "speedup": f"{winner['verdict']['speedup']:.3f}" if winner else "-",
        "tokens/s before": f"{gate['tps_before']:.0f}" if gate else "-",
        "tokens/s after": f"{gate['tps_after']:.0f}" if gate else "-",
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", default="rmsnorm,silu_mul")
    parser.add_argument("--candidates", type=int, default=4)
    parser.add_argument("--out-dir", type=Path, default=None)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("tune_gpu: no CUDA device", file=sys.stderr)
        return 1
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = write_model_dir(Path(tmp), LLAMA3_8B)
        (model_dir / "tokenizer_config.json").write_text(json.dumps({"chat_template": CHAT_TEMPLATE}))
        with History(Path(tmp) / "history.db") as history:
            ctx = LoopContext(history=history, registry=Registry(Path(tmp) / "registry"),
                              proposers={"search": SearchProposer()}, device="cuda", model=str(model_dir),
                              random_weights=True,
                              gate=GateConfig(prompts=GATE_PROMPTS, max_tokens=8, repeats=2),
                              progress=lambda m: print(m, flush=True))
            try:
                for op in args.ops.split(","):
                    settings = TuneSettings(op=op, device="cuda", rounds=1, candidates=args.candidates,
                                            profile_requests=16, sandbox_timeout_s=60)
                    rows.append(_row(op, run_tune(settings, ctx)))
                    rows[-1]["correct candidates"] = sum(bool(a["correct"]) for a in history.attempts(op=op))
            finally:
                ctx.close()
    print_table(rows)
    notes = ["Search proposer, one round per op, Llama-3-8B shape with random bf16 weights, in-process engine "
             "(eager while profiled; CUDA graphs otherwise). Timings are the sandbox's (CUDA events with L2 flush, "
             "graphs under 20 us); tokens/s are the gate's greedy batch of 4 prompts x 8 tokens."]
    path = write_report("agent-tune", "agent tune on the GPU (search proposer)", rows, device="cuda", notes=notes,
                        out_dir=args.out_dir)
    print(f"wrote {path}")
    # A pass proves the loop ran on the GPU: a winner, or no winner among candidates judged correct
    # (a "no-winner" where every candidate crashed proves nothing).
    return 0 if all(r["result"] == "winner" or (r["result"] == "no-winner" and r["correct candidates"])
                    for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
