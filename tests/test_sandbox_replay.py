"""Recording a call and replaying it from the record alone (in-process: the mechanism, not the isolation)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from kernelloop.kernels.device import CPU
from kernelloop.kernels.ops import get_op
from kernelloop.sandbox.inside import trace
from kernelloop.sandbox.inside.replay import Replay, ReplayError, kernels_from_module, kernels_from_source
from kernelloop.sandbox.inside.worker import load_module
from kernelloop.sandbox.judge.decisions import same_bits

CANDIDATES = Path(__file__).resolve().parent / "sandbox_candidates"
STATE: dict = {"recorder": None}
trace.install_launch_hook(STATE)


def _record(forward, args: tuple) -> tuple:
    rec = trace.Recorder()
    rec.begin(args)
    STATE["recorder"] = rec
    try:
        with rec:
            out = forward(*args)
    finally:
        STATE["recorder"] = None
    record = rec.finish(out)
    return out, json.loads(json.dumps(record)), rec  # the record crosses the channel as JSON


def _fresh(args: tuple) -> list[torch.Tensor]:
    """Copies of the tensor inputs with the same layout (as the channel delivers them)."""
    return [torch.empty(0, dtype=a.dtype).set_(a.untyped_storage().clone(), a.storage_offset(), a.shape, a.stride())
            for a in args if isinstance(a, torch.Tensor)]


@pytest.mark.parametrize("op", ["rmsnorm", "fused_add_rmsnorm", "silu_mul", "rope", "decode_attention"])
def test_baseline_replays_bit_for_bit(op: str) -> None:
    spec = get_op(op)
    args = spec.make_inputs(spec.test_shapes[1], torch.float32, 3, "cpu")
    out, record, rec = _record(spec.forward, args)
    assert record["problem"] is None and not rec.forbidden
    assert any(e["kind"] == "launch" for e in record["entries"])
    replayed = Replay(kernels_from_module(spec.forward.__module__), CPU).run(record, _fresh(args))
    outs = out if isinstance(out, tuple) else (out,)
    assert len(replayed) == len(outs) and all(same_bits(a, b) for a, b in zip(replayed, outs))


def test_a_candidate_replays_from_its_source_without_its_python() -> None:
    source = (CANDIDATES / "control_rmsnorm_row.py").read_text()
    forward, constants = load_module(source, "control_rmsnorm_row.py")
    spec = get_op("rmsnorm")
    args = spec.make_inputs({"tokens": 5, "hidden": 40}, torch.float32, 1, "cpu", {"layout": "strided"})
    out, record, _ = _record(forward, args)
    kernels = kernels_from_source(source, constants)
    assert set(kernels) == {"_row_kernel"}  # forward itself is not there
    replayed = Replay(kernels, CPU).run(record, _fresh(args))
    assert same_bits(replayed[0], out)


def test_output_made_outside_the_kernels_is_not_reproduced() -> None:
    spec = get_op("rmsnorm")
    args = spec.make_inputs({"tokens": 3, "hidden": 16}, torch.float32, 1, "cpu")

    def cheat(x, w, eps):  # a real launch, then the answer computed with torch out of the recorder's sight
        y = spec.forward(x, w, eps)
        with torch.utils._python_dispatch._disable_current_modes():
            y.copy_(spec.reference(x, w, eps) + 0.5)
        return y

    out, record, _ = _record(cheat, args)
    replayed = Replay(kernels_from_module(spec.forward.__module__), CPU).run(record, _fresh(args))
    assert not same_bits(replayed[0], out)


def test_memory_from_nowhere_is_untraceable() -> None:
    spec = get_op("rmsnorm")
    stash = torch.empty(3, 16)  # allocated outside the call: the replay could not know its content

    def uses_stash(x, w, eps):
        return spec.forward(x, w, eps).copy_(stash) if False else _launch_into(stash, x, w, eps)

    def _launch_into(buf, x, w, eps):
        from kernelloop.kernels.ops.rmsnorm_kernel import _rmsnorm_kernel

        _rmsnorm_kernel[(3,)](x, w, buf, 16, 16, 16, eps, BLOCK_N=16)
        return buf.clone()

    _, record, _ = _record(uses_stash, spec.make_inputs({"tokens": 3, "hidden": 16}, torch.float32, 1, "cpu"))
    assert record["problem"] and "neither an input nor allocated" in record["problem"]


@pytest.mark.parametrize("mutate, message", [
    (lambda r: r["entries"].append({"kind": "aten", "op": "aten.mul.Tensor", "args": [], "kwargs": {}, "new": []}),
     "not replayable"),
    (lambda r: r["entries"].append({"kind": "aten", "op": "aten.empty.__call__", "args": [], "kwargs": {},
                                    "new": []}), "not replayable"),
    (lambda r: r["entries"].append({"kind": "launch", "kernel": "forward", "grid": [1, 1, 1], "args": [],
                                    "kwargs": {}}), "not a top-level"),
    (lambda r: r["outputs"].__setitem__(0, {"buf": 99, "offset": 0, "shape": [1], "stride": [1],
                                            "dtype": "float32"}), "unknown buffer"),
    (lambda r: r["outputs"].__setitem__(0, {"buf": 0, "offset": 0, "shape": [10 ** 6], "stride": [1],
                                            "dtype": "float32"}), "past its storage"),
    (lambda r: r.__setitem__("inputs", 7), "does not match"),
    (lambda r: [e for e in r["entries"] if e["kind"] == "launch"][0].__setitem__("grid", [1, -1, 1]), "bad grid"),
    (lambda r: [e for e in r["entries"] if e["kind"] == "launch"][0]["args"].__setitem__(
        0, {"ptr": 0, "byte_offset": 1 << 40, "dtype": "float32"}), "bad pointer"),
])
def test_a_forged_record_is_refused(mutate, message: str) -> None:
    spec = get_op("rmsnorm")
    args = spec.make_inputs({"tokens": 2, "hidden": 8}, torch.float32, 1, "cpu")
    _, record, _ = _record(spec.forward, args)
    mutate(record)
    with pytest.raises(ReplayError, match=message):
        Replay(kernels_from_module(spec.forward.__module__), CPU).run(record, _fresh(args))


def test_rebuilding_keeps_only_kernels_and_refuses_code_in_defaults() -> None:
    source = '''
import os
import triton
import triton.language as tl
SCALE = 2.0
BLOCK: tl.constexpr = 16
open("/tmp/kernelloop-should-not-exist", "w")

@triton.jit
def k(x_ptr, n):
    pass

def forward(x):
    return x
'''
    kernels = kernels_from_source(source, {"SCALE": 2.0, "BLOCK": {"constexpr": 16}})
    assert list(kernels) == ["k"]
    assert not Path("/tmp/kernelloop-should-not-exist").exists()
    with pytest.raises(ReplayError, match="default values"):
        kernels_from_source("import triton\n@triton.jit\ndef k(x, y=print('hi')):\n    pass\n", {})
    with pytest.raises(ReplayError, match="constant"):
        kernels_from_source(source, {"__builtins__": 1})
    with pytest.raises(ReplayError, match="rebuilding"):
        kernels_from_source("from triton import _C\nimport triton\n@triton.jit\ndef k(x):\n    pass\n", {})


EMPTY_SLICE_SOURCE = '''
import torch
import triton
import triton.language as tl

@triton.jit
def _copy_kernel(x_ptr, extra_ptr, y_ptr, n, n_extra, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    extra = tl.load(extra_ptr + offs, mask=offs < n_extra, other=0.0)  # never read when empty
    tl.store(y_ptr + offs, x + extra, mask=offs < n)

def forward(x, w):
    y = torch.empty_like(x)
    empty = w[w.numel():]  # an empty slice of a real buffer: its data_ptr() is null
    _copy_kernel[(1,)](x, empty, y, x.numel(), empty.numel(), BLOCK=16)
    return y
'''


def test_an_empty_slice_passed_to_a_kernel_replays() -> None:
    """A kernel handed an empty slice (no prefix, no tail) is traced and replayed, not refused as untraceable:
    an empty tensor's data_ptr() is null, so its byte offset cannot come from there."""
    forward, constants = load_module(EMPTY_SLICE_SOURCE, "empty_slice.py")
    args = (torch.arange(10, dtype=torch.float32), torch.ones(4))
    out, record, _ = _record(forward, args)
    assert record["problem"] is None
    launch = [e for e in record["entries"] if e["kind"] == "launch"][0]
    assert launch["args"][1]["byte_offset"] == 16  # 4 floats in, not (0 - pointer)
    replayed = Replay(kernels_from_source(EMPTY_SLICE_SOURCE, constants), CPU).run(record, _fresh(args))
    assert same_bits(replayed[0], out)
