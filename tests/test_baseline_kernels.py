"""Issue #15: each op's baseline kernel is one self-contained file, kernels/ops/<op>_kernel.py, in the
candidate format: the same text is the baseline the engine runs, the LLM's example, a search
template's starting source and what `agent ops --template OP` prints.

Every file: the sandbox's static check accepts it as it is, it imports only torch/triton/math, the
spec's `forward` is its `forward`, and loaded as a candidate (guarded builtins, no kernelloop) it
matches the reference. One op goes through the real `agent check` (correctness only); tests/test_cli.py
judges rmsnorm's `--template` output the same way.
"""

from __future__ import annotations

import ast
import inspect
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kernelloop.agent.proposers.templates import modules
from kernelloop.kernels.candidate.static_check import static_check
from kernelloop.kernels.compare import check_impl
from kernelloop.kernels.ops import OPS, baseline_file, baseline_source, get_op
from kernelloop.sandbox.inside.worker import load_module

ROOTS = {"torch", "triton", "math", "__future__", "dataclasses"}


@pytest.mark.parametrize("op", list(OPS))
def test_the_baseline_file_is_a_legal_candidate_as_it_is(op: str) -> None:
    spec, source = get_op(op), baseline_source(op)
    result = static_check(source, spec.arg_names)
    assert result.ok, result.reason
    imported = {a.name.split(".")[0] for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Import) for a in n.names}
    imported |= {(n.module or "").split(".")[0] for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ImportFrom)}
    assert imported <= ROOTS, imported - ROOTS
    assert inspect.getsourcefile(spec.forward) == str(baseline_file(op)) and baseline_file(op).name == f"{op}_kernel.py"
    forward, _ = load_module(source, baseline_file(op).name)
    shape = spec.test_shapes[0]
    result = check_impl(spec, forward, shape, torch.float32, seed=3)
    assert result.ok, str(result)


@pytest.mark.parametrize("op", list(modules()))
def test_templates_do_not_retype_the_baseline(op: str) -> None:
    """A template whose kernel is the baseline's renders the baseline file (templates.from_baseline);
    no template module holds a copy of a baseline function."""
    template_text = inspect.getsource(modules()[op])
    source = baseline_source(op)
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef) and node.name != "forward":
            body = ast.get_source_segment(source, node) or ""
            assert body.split("\n", 1)[-1] not in template_text, f"{op}: templates repeat {node.name}"


def test_one_baseline_file_through_agent_check(tmp_path: Path) -> None:
    op = "silu_mul"
    judged = subprocess.run(
        [sys.executable, "-m", "kernelloop.agent.cli", "check", op, str(baseline_file(op)), "--json", "--no-timing",
         "--device", "cpu", "--dtypes", "float32", "--no-history", "--registry", str(tmp_path / "registry")],
        capture_output=True, text=True, timeout=300)
    assert judged.returncode == 0, judged.stderr[-2000:]
    verdict = json.loads(judged.stdout.strip().splitlines()[-1])
    assert verdict["correct"] and verdict["failure"] is None, verdict["reason"]
