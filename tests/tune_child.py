"""A tune run in its own process, for the crash-and-resume test: `python -m tests.tune_child DIR MODEL`.

It resumes the unfinished run in DIR's history when there is one, exactly as `agent tune` does.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from kernelloop.agent.gate_config import GATE_PROMPTS, GateConfig
from kernelloop.agent.loop.context import LoopContext
from kernelloop.agent.loop.graph import run_tune, unfinished_run
from kernelloop.agent.loop.state import TuneSettings
from kernelloop.agent.proposers.base import Proposal
from kernelloop.history import History
from kernelloop.kernels.registry import Registry

CANDIDATES = Path(__file__).parent / "sandbox_candidates"
FILES = ["unwritten_tail.py", "control_rmsnorm_row.py", "control_rmsnorm_multirow.py"]


class Fixed:
    """A Proposer (agent/proposers/base.py): the three files once, then nothing."""

    last_error = None
    rejected: list = []

    def propose(self, ctx, feedback, n):  # noqa: ANN001
        return [] if feedback else [Proposal((CANDIDATES / f).read_text(), "fixed", f) for f in FILES]

    def close(self) -> None:
        pass


def main(folder: Path, model: str, pool: Any = None) -> None:
    """One tune run (resumed when one is unfinished) with the fixed files; `pool`: judged on a cluster."""
    with History(folder / "history.db") as history:
        ctx = LoopContext(history=history, registry=Registry(folder / "registry"), proposers={"fixed": Fixed()},
                          model=model, gate=GateConfig(prompts=GATE_PROMPTS[:2], max_tokens=3, runaway_tokens=0, invariance_tokens=0,
                                         tps_tolerance=0.5),  # what is resumed is tested here, not speed: at ~4 tok/s
                                         # on the interpreter 3 gate rounds can all read 0.8x by chance
                          progress=lambda m: print(m, flush=True), pool=pool)
        try:
            state = run_tune(TuneSettings(op="rmsnorm", rounds=1, candidates=3, profile_requests=2), ctx,
                             resume=unfinished_run(ctx, "rmsnorm"))
        finally:
            ctx.close()
    print("FINAL", state["status"], flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
