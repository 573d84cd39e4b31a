"""Shared by the static-check tests: a candidate's usual header, its `forward`, and `check(body)`."""

from __future__ import annotations

from kernelloop.kernels.candidate.static_check import static_check

ARGS = ("x", "weight", "eps")
HEADER = "import torch\nimport triton\nimport triton.language as tl\n"
FORWARD = "\ndef forward(x, weight, eps):\n    return x\n"


def check(body: str):
    return static_check(HEADER + body + FORWARD, ARGS)
