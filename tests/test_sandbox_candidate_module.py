"""A candidate is a real module: what the static check allows (dataclasses, typing) works when loaded."""

from __future__ import annotations

from pathlib import Path

from kernelloop.sandbox import CheckOptions, Sandbox

REPO = Path(__file__).resolve().parents[1]
HONEST = (REPO / "tests" / "sandbox_candidates" / "control_rmsnorm_row.py").read_text()
# linear's baseline keeps its launch parameters in a frozen dataclass: @dataclass looks its class's
# module up in sys.modules, which the runner's fresh module must therefore be in.
WITH_DATACLASS = HONEST.replace("import torch\n", "from dataclasses import dataclass\n\nimport torch\n", 1).replace(
    "def forward(", '''@dataclass(frozen=True)
class Config:
    num_warps: int = 4


CONFIG = Config()


def forward(''').replace("BLOCK=triton.next_power_of_2(n))", "BLOCK=triton.next_power_of_2(n), num_warps=CONFIG.num_warps)")


def test_a_candidate_may_define_a_dataclass(tmp_path: Path) -> None:
    assert "@dataclass" in WITH_DATACLASS and "CONFIG.num_warps" in WITH_DATACLASS
    options = CheckOptions(device="cpu", registry_baseline=False, dtypes=("float32",), timing=False, seed=5)
    with Sandbox(options) as sandbox:
        v = sandbox.judge_source("rmsnorm", WITH_DATACLASS, "with_dataclass.py")
    assert v.correct and v.failure is None, v.reason
