"""The replay rebuilds real kernels as the runner made them (sandbox/inside/replay_source.py): under a module-level
`if`, jitted by assignment, with imports in a `try`; from the canonical text, running no launcher code;
taking the branch the runner took, or refusing what it cannot redo faithfully."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from kernelloop.kernels.device import CPU
from kernelloop.kernels.ops import get_op
from kernelloop.sandbox.inside import trace
from kernelloop.sandbox.inside.replay import Replay, ReplayError, kernels_from_source
from kernelloop.sandbox.inside.worker import load_module
from kernelloop.sandbox.judge.decisions import same_bits

CANDIDATES = Path(__file__).resolve().parent / "sandbox_candidates"
STATE: dict = {"recorder": None}
trace.install_launch_hook(STATE)
HEAD = "import torch\nimport triton\nimport triton.language as tl\n"
KERNEL = '''
@triton.jit
def {name}(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * {scale}, mask=offs < n)
'''


def _kernel(name: str = "_k", scale: str = "2.0", indent: str = "") -> str:
    return "".join(indent + line if line.strip() else line for line in KERNEL.format(name=name, scale=scale).splitlines(True))


def _record_and_replay(source: str, op: str, shapes: int = 2) -> None:
    """The runner's call and its replay from the source agree bit for bit (what the judge requires)."""
    forward, constants = load_module(source, "candidate.py")
    spec = get_op(op)
    kernels = kernels_from_source(source, constants)
    for shape in spec.test_shapes[:shapes]:
        args = spec.make_inputs(shape, torch.float32, 3, "cpu")
        rec = trace.Recorder()
        rec.begin(args)
        STATE["recorder"] = rec
        try:
            with rec:
                out = forward(*args)
        finally:
            STATE["recorder"] = None
        record = json.loads(json.dumps(rec.finish(out)))
        assert record["problem"] is None
        fresh = [torch.empty(0, dtype=a.dtype).set_(a.untyped_storage().clone(), a.storage_offset(), a.shape, a.stride())
                 for a in args if isinstance(a, torch.Tensor)]
        replayed = Replay(kernels, CPU).run(record, fresh)
        outs = out if isinstance(out, tuple) else (out,)
        assert len(replayed) == len(outs) and all(same_bits(a, b) for a, b in zip(replayed, outs))


@pytest.mark.parametrize("name, op", [("control_silu_mul_guarded_kernels", "silu_mul"),
                                      ("control_silu_mul_jit_assignment", "silu_mul"),
                                      ("control_idiom_unsloth_rope", "rope"),
                                      ("control_idiom_liger_rmsnorm", "rmsnorm")])
def test_real_module_structures_replay_bit_for_bit(name: str, op: str) -> None:
    _record_and_replay((CANDIDATES / f"{name}.py").read_text(), op)


def test_kernels_under_if_by_assignment_and_in_try_are_rebuilt_and_launcher_code_is_not_run() -> None:
    source = HEAD + '''
try:
    from triton.language.extra.libdevice import exp
except (ImportError, AttributeError):
    from triton.language.extra.cuda.libdevice import exp
open("/tmp/kernelloop-canary-replay-source", "w")
if triton.__version__ >= "3.0" and not FLAG:
''' + _kernel("_a", "2.0", "    ") + "else:\n" + _kernel("_a", "3.0", "    ") + '''

def _b_impl(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    _a(x_ptr, y_ptr, n, BLOCK)


_b = triton.jit(_b_impl)
_c = triton.autotune(configs=[triton.Config({"BLOCK": 16})], key=["n"])(triton.jit(_b_impl))
'''
    kernels = kernels_from_source(source, {"FLAG": False})
    assert sorted(kernels) == ["_a", "_b_impl"]
    other = kernels_from_source(source, {"FLAG": True})["_a"]
    assert kernels["_a"].fn.__code__.co_firstlineno < other.fn.__code__.co_firstlineno  # the branch the constants pick
    assert not Path("/tmp/kernelloop-canary-replay-source").exists()


@pytest.mark.parametrize("structure, message", [
    ("if torch.cuda.is_available():\n" + _kernel(indent="    "), "may test only"),
    ("if _flags():\n" + _kernel(indent="    "), "may test only"),
    ("if NOT_A_CONSTANT:\n" + _kernel(indent="    "), "not a plain constant"),
    ("if triton._C:\n" + _kernel(indent="    "), r"reads \._C"),
    ("try:\n    import triton.language.extra.libdevice as ld\n    X = 1\nexcept ImportError:\n    pass\n" + _kernel(),
     "may hold only"),
    ("try:\n" + _kernel(indent="    ") + "except Exception:\n    pass\n", "may catch only"),
    ("try:\n" + _kernel(indent="    ") + "except:\n    pass\n", "may catch only"),
    (_kernel().replace("BLOCK: tl.constexpr)", "BLOCK: tl.constexpr = print('x'))"), "default values"),
], ids=["if-call", "if-function", "if-unknown-name", "if-private", "try-other-code", "try-exception", "try-bare",
        "default-code"])
def test_structure_the_replay_cannot_redo_faithfully_is_refused(structure: str, message: str) -> None:
    with pytest.raises(ReplayError, match=message):
        kernels_from_source(HEAD + structure, {})


def test_launcher_code_around_no_kernel_is_dropped_whatever_it_tests() -> None:
    source = HEAD + "if torch.cuda.is_available():\n    DEVICE = 'cuda'\nelse:\n    DEVICE = 'cpu'\n" \
        "try:\n    import numpy\nexcept Exception:\n    numpy = None\n" + _kernel()
    assert list(kernels_from_source(source, {"DEVICE": "cpu"})) == ["_k"]


def test_a_branch_chosen_by_a_constant_changed_after_the_if_is_refused_or_replayed_faithfully() -> None:
    """The replay evaluates the test with the value the runner reported after import: a module that
    changes it later makes the replay build the other branch, whose bits differ (launch-independent)."""
    source = HEAD + "USE_TWO = True\nif USE_TWO:\n" + _kernel(scale="2.0", indent="    ") + "else:\n" + \
        _kernel(scale="3.0", indent="    ") + "USE_TWO = False\n\n\ndef forward(x):\n    y = torch.empty_like(x)\n" \
        "    _k[(1,)](x, y, x.numel(), BLOCK=16)\n    return y\n"
    forward, constants = load_module(source, "candidate.py")
    assert constants["USE_TWO"] is False
    x = torch.arange(4, dtype=torch.float32)
    rec = trace.Recorder()
    rec.begin((x,))
    STATE["recorder"] = rec
    try:
        with rec:
            out = forward(x)
    finally:
        STATE["recorder"] = None
    (replayed,) = Replay(kernels_from_source(source, constants), CPU).run(json.loads(json.dumps(rec.finish(out))),
                                                                           [x.clone()])
    assert torch.equal(out, x * 2) and torch.equal(replayed, x * 3) and not same_bits(out, replayed)
