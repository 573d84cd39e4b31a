"""Issue #15: adding an op is one op module (spec + self-contained kernel file) and, optionally, one
templates module, and nothing else.

A toy op (y = x * 2) is written as a package into a temporary folder and named in
$KERNELLOOP_OP_PACKAGES; real `agent` processes then list it, print its template, judge candidates
for it in the sandbox (whose fork server must find the same op) and the search proposer offers
candidates for it, without any file of the repository knowing about it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kernelloop.common.errors import KernelloopError
from kernelloop.kernels.ops import OP_PACKAGES_ENV, discover, extra_packages, op_import_roots

SPEC_MODULE = '''"""toy(x) -> y = 2 * x, x [rows, n]: the spec."""

from __future__ import annotations

import torch

from kernelloop.kernels.spec import DEFAULT_TOLERANCES, Cost, OpSpec

from .toy_kernel import forward


def reference(x: torch.Tensor) -> torch.Tensor:
    return (x.float() * 2.0).to(x.dtype)


def make_inputs(shape, dtype, seed, device, variant=None):
    g = torch.Generator(device="cpu").manual_seed(seed)
    return (torch.randn(shape["rows"], shape["n"], generator=g).to(dtype=dtype, device=device),)


SPEC = OpSpec(
    name="toy", signature="toy(x) -> y", summary="y = 2 * x, elementwise.",
    reference=reference, forward=forward, make_inputs=make_inputs,
    shape_of=lambda x: {"rows": x.shape[0], "n": x.shape[1]},
    dispatch_key=lambda x: (x.dtype, x.shape[1], x.shape[0]),
    cost=lambda shape, dtype: Cost(bytes=2 * shape["rows"] * shape["n"] * dtype.itemsize,
                                   flops=shape["rows"] * shape["n"]),
    engine_shapes=({"rows": 4, "n": 96},), test_shapes=({"rows": 3, "n": 33}, {"rows": 2, "n": 64}),
    bucketed=frozenset({"rows"}), tolerances={torch.float32: DEFAULT_TOLERANCES[torch.float32]},
    held_back=({"rows": 1, "n": 1},),
)
'''

KERNEL_FILE = '''"""toy(x) -> y = 2 * x: the baseline kernel, a flat grid of BLOCK elements per program."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 64


@triton.jit
def _scale_kernel(x_ptr, y_ptr, total, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < total
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + offs, (x * 2.0).to(y_ptr.dtype.element_ty), mask=mask)


def forward(x: torch.Tensor) -> torch.Tensor:
    x = x if x.is_contiguous() else x.contiguous()
    y = torch.empty_like(x)
    if x.numel():
        _scale_kernel[(triton.cdiv(x.numel(), BLOCK),)](x, y, x.numel(), BLOCK=BLOCK)
    return y
'''

TEMPLATES_MODULE = '''"""toy's search templates: the baseline kernel with its block size as the parameter."""

from kernelloop.agent.proposers.templates import check_params, from_baseline

OP = "toy"
DOMAINS = {"flat": {"block": [32, 64, 128]}}


def space(ctx):
    return [{"template": "flat", "block": b} for b in (128, 32, 64)]


def render(params):
    check_params(OP, params, DOMAINS)
    return from_baseline(OP, params, {"BLOCK": params["block"]})
'''

PROPOSE = '''
import json, sys
from kernelloop.agent.proposers.base import TuneContext
from kernelloop.agent.proposers.search import SearchProposer
from kernelloop.kernels.device import CPU
from kernelloop.kernels.ops import baseline_source, get_op
ctx = TuneContext(spec=get_op("toy"), dtype="float32", device=CPU, shapes=({"rows": 4, "n": 96},), best_source=None,
                  baseline_source=baseline_source("toy"), roofline={}, failures=())
print(json.dumps([[p.label, p.source] for p in SearchProposer().propose(ctx, [], 2)]))
'''


def write_toy_package(root: Path, name: str = "toyops") -> Path:
    package = root / name
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "toy.py").write_text(SPEC_MODULE)
    (package / "toy_kernel.py").write_text(KERNEL_FILE)
    (package / "templates.py").write_text(TEMPLATES_MODULE)
    return package


def agent(env: dict[str, str], *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kernelloop.agent.cli", *args], env=env, capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.slow
def test_a_toy_op_from_its_own_package_is_listed_checked_judged_and_searched(tmp_path: Path) -> None:
    write_toy_package(tmp_path / "plugins")
    env = {**os.environ, OP_PACKAGES_ENV: "toyops", "PYTHONPATH": str(tmp_path / "plugins"),
           "KERNELLOOP_REGISTRY": str(tmp_path / "registry")}

    listed = agent(env, "ops", "--json")
    assert listed.returncode == 0, listed.stderr[-2000:]
    toy = next(d for d in json.loads(listed.stdout)["ops"] if d["name"] == "toy")
    assert toy["signature"] == "toy(x) -> y" and "rmsnorm" in [d["name"] for d in json.loads(listed.stdout)["ops"]]

    template = agent(env, "ops", "--template", "toy")
    assert template.returncode == 0 and template.stdout.endswith(KERNEL_FILE), template.stderr[-2000:]

    proposed = subprocess.run([sys.executable, "-c", PROPOSE], env=env, capture_output=True, text=True, timeout=120)
    assert proposed.returncode == 0, proposed.stderr[-2000:]
    offers = json.loads(proposed.stdout)
    assert [label for label, _ in offers] == ["toy flat block=128", "toy flat block=32"]
    assert "BLOCK = 128\n" in offers[0][1] and offers[0][1].startswith("# kernelloop-search: ")

    (tmp_path / "good.py").write_text(template.stdout)
    (tmp_path / "wrong.py").write_text(template.stdout.replace("x * 2.0", "x * 2.5"))
    (tmp_path / "searched.py").write_text(offers[0][1])
    judged = agent(env, "check", "toy", *(str(tmp_path / f) for f in ("good.py", "wrong.py", "searched.py")),
                   "--json", "--device", "cpu", "--no-history")
    assert judged.returncode == 0, judged.stderr[-2000:]
    verdicts = {Path(v["file"]).name: v for v in map(json.loads, judged.stdout.strip().splitlines())}
    for name in ("good.py", "searched.py"):  # correct; accepted only if timing says faster
        assert verdicts[name]["op"] == "toy" and verdicts[name]["correct"], verdicts[name]["reason"]
    assert not verdicts["wrong.py"]["correct"] and verdicts["wrong.py"]["failure"] == "mismatch"
    assert not verdicts["wrong.py"]["accepted"]


def test_discovery_finds_specs_and_the_folders_children_need(tmp_path: Path, monkeypatch) -> None:
    plugins = tmp_path / "plugins"
    write_toy_package(plugins / "kl_outer", "toyops")
    (plugins / "kl_outer" / "__init__.py").write_text("")
    (plugins / "kl_toy_again.py").write_text(  # a single module holding a SPEC is an op package too
        "import dataclasses\nfrom kl_outer.toyops.toy import SPEC as _toy\nSPEC = dataclasses.replace(_toy)\n")
    monkeypatch.syspath_prepend(str(plugins))
    monkeypatch.setenv(OP_PACKAGES_ENV, "kl_outer.toyops, kl_outer.toyops kl_toy_again")
    assert extra_packages() == ("kl_outer.toyops", "kl_toy_again")
    ops = discover(extra_packages()[:1])
    assert list(ops) == ["toy"] and ops["toy"].forward.__module__ == "kl_outer.toyops.toy_kernel"
    assert op_import_roots() == [str(plugins.resolve())]  # what the fork server's PYTHONPATH gets
    with pytest.raises(KernelloopError, match="op 'toy' is defined twice"):
        discover(extra_packages())
    with pytest.raises(KernelloopError, match="cannot import op package 'no_such_ops'"):
        discover(["no_such_ops"])
