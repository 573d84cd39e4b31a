"""The runtime half of purity (kernels/candidate/runtime_purity.py, the caches in guarded_builtins.py):
module state frozen after import and checked unchanged after every call, in the runner and in the engine
(the dispatcher demotes a kernel that breaks it); outputs never share memory (sandbox/judge/aliasing.py).
The loads here skip the static check: they show the runtime layer alone."""

from __future__ import annotations

import functools
import types
from pathlib import Path

import pytest
import torch

from kernelloop.kernels.candidate.guarded_builtins import STAND_INS
from kernelloop.kernels.candidate.loader import load_kernel
from kernelloop.kernels.candidate.runtime_purity import IMPURE, ImpureModule
from kernelloop.kernels.device import CPU
from kernelloop.kernels.dispatch import Dispatcher
from kernelloop.kernels.ops import get_op
from kernelloop.kernels.registry.entry import Provenance
from kernelloop.sandbox.judge.aliasing import overlap
from kernelloop.sandbox.judge.decisions import judge_call
from kernelloop.sandbox.verdict import Verdict

CANDIDATES = Path(__file__).resolve().parent / "sandbox_candidates"
HONEST = (CANDIDATES / "control_rmsnorm_row.py").read_text()
SPEC = get_op("rmsnorm")


def _args(seed: int = 0) -> tuple:
    return SPEC.make_inputs(SPEC.test_shapes[0], torch.float32, seed, "cpu")


def _with(state: str, bump: str) -> str:
    """HONEST with module-level `state` and a `bump` statement run by every forward call."""
    return HONEST.replace("def forward(", state + "\n\ndef forward(", 1).replace(
        "    n = x.shape[-1]\n", f"    {bump}\n    n = x.shape[-1]\n", 1)


def test_module_containers_are_frozen_recursively_and_stay_shared() -> None:
    source = HONEST + '''
SIZES = [1, [2, 3], {"a": [4]}]
TABLE = {"k": SIZES, "s": {5, 6}}
RAW = bytearray(b"ab")


class Cfg:
    blocks = [16, 32]

    def __init__(self) -> None:
        self.warps = [4, 8]


CFG = Cfg()


def helper(x=[1], *, y={"z": 1}):
    return x, y


def make():
    seen = [0]
    return lambda: seen


READ = make()
'''
    ns = load_kernel(source, static=False).namespace
    assert ns["SIZES"] == (1, (2, 3), types.MappingProxyType({"a": (4,)})) and type(ns["SIZES"]) is tuple
    assert ns["TABLE"]["k"] is ns["SIZES"] and ns["TABLE"]["s"] == frozenset({5, 6})  # shared stays shared
    assert ns["RAW"] == b"ab" and type(ns["RAW"]) is bytes
    assert ns["Cfg"].blocks == (16, 32) and ns["CFG"].warps == (4, 8)
    assert ns["helper"]() == ((1,), {"z": 1}) and type(ns["helper"]()[0]) is tuple
    assert ns["READ"]() == (0,)
    with pytest.raises(TypeError):
        ns["TABLE"]["new"] = 1


@pytest.mark.parametrize("state", [
    "import itertools\nTICKS = itertools.count()",
    "GEN = (i for i in range(10))",
    "IT = iter([1, 2, 3])",
    "PAIRS = (1, zip([1], [2]))",
], ids=["count", "generator", "iter", "zip-in-a-tuple"])
def test_a_module_level_iterator_is_refused_at_import(state: str) -> None:
    with pytest.raises(ImpureModule, match="advances") as info:
        load_kernel(HONEST + "\n" + state + "\n", static=False)
    assert str(info.value).startswith(IMPURE)


COUNTER = "def counter():\n    n = 0\n\n    def tick():\n        nonlocal n\n        n += 1\n\n    return tick\n\n\nTICK = counter()"


@pytest.mark.parametrize("state, bump, what, engine", [
    ("CALLS = 0", "global CALLS; CALLS += 1", "'CALLS' rebound", True),
    ("NEW = 0", "global EXTRA; EXTRA = 1", "'EXTRA' added", True),
    ("GONE = 0", "global GONE; del GONE", "deleted|rebound", True),
    (COUNTER, "TICK()", "closure variable n", True),
    ("class K:\n    n = 0", "K.n += 1", "class K changed", False),
    ("class K:\n    def __init__(self):\n        self.n = 0\n\n\nOBJ = K()", "OBJ.n += 1", "object OBJ changed", False),
    ("B = 0", "__builtins__['calls'] = 1", "its builtins changed", False),
], ids=["global-rebound", "global-added", "global-deleted", "closure-cell", "class-attribute", "instance-attribute",
        "builtins"])
def test_state_changed_by_a_call_makes_that_call_impure(state: str, bump: str, what: str, engine: bool) -> None:
    """The judge's check sees every kind; the engine's (cheaper, per call) the module's names and cells."""
    if not engine:  # not looked at by the engine's check: refused by the judge's
        load_kernel(_with(state, bump), static=False).forward(*_args())
    loaded = load_kernel(_with(state, bump), static=False, thorough=not engine)
    with pytest.raises(ImpureModule, match=what) as info:
        loaded.forward(*_args())
    assert str(info.value).startswith(IMPURE)
    with pytest.raises((ImpureModule, NameError)):  # every call after too: the snapshot is the module as imported
        loaded.forward(*_args(1))


def test_honest_state_at_import_and_pure_cached_helpers_pass_every_call() -> None:
    source = _with('''import functools

SETTINGS = {"rmsnorm": [1024, 4]}


@functools.lru_cache(maxsize=None)
def settings(n: int) -> tuple:
    return (triton.next_power_of_2(n), SETTINGS["rmsnorm"])''', "settings(x.shape[-1])")
    loaded = load_kernel(source, static=False)
    for seed in range(3):
        torch.testing.assert_close(loaded.forward(*_args(seed)), SPEC.reference(*_args(seed)), atol=1e-5, rtol=1e-5)
    assert loaded.namespace["settings"](64) == (64, (1024, 4))  # a cached result is frozen


def test_caches_refuse_tensors_keep_no_statistics_and_freeze_results() -> None:
    guarded = STAND_INS["functools"]

    @guarded.lru_cache(maxsize=8)
    def buffer(n: int) -> tuple:
        return (n, torch.empty(n))

    @guarded.cache
    def sizes(n: int) -> list:
        return [n, [n]]

    with pytest.raises(ImpureModule, match="tensor"):
        buffer(3)
    assert sizes(2) == (2, (2,)) and sizes(2) is sizes(2)
    assert not hasattr(sizes, "cache_info") and not hasattr(sizes, "cache_clear")

    class Holder:
        @guarded.cached_property
        def out(self) -> torch.Tensor:
            return torch.zeros(2)

    holder = Holder()
    with pytest.raises(ImpureModule):
        holder.out  # noqa: B018
    assert "out" not in vars(holder)
    assert guarded.partial is functools.partial and guarded.reduce is functools.reduce


def test_the_dispatcher_demotes_a_registry_kernel_whose_state_changes(registry, monkeypatch) -> None:
    """A bomb the static check would refuse, loaded without it: the first call that changes state is
    served by the baseline instead, and the demotion is listed."""
    monkeypatch.setattr("kernelloop.kernels.registry.loader.load_kernel", functools.partial(load_kernel, static=False))
    bomb = _with("CALLS = 0", "global CALLS; CALLS += 1")
    args = _args()
    key_bucket = SPEC.bucket(SPEC.shape_of(*args))
    registry.add("rmsnorm", bomb, device="cpu-interpreter", dtype="float32", bucket=key_bucket, speedup=2.0,
                 speedup_ci=(1.5, 2.5), provenance=Provenance("search"))
    kd = Dispatcher("registry", registry=registry, device=CPU)
    out = kd.rmsnorm(*args)
    torch.testing.assert_close(out, SPEC.reference(*args), atol=1e-5, rtol=1e-5)
    (demotion,) = kd.demotions
    assert demotion.variant.startswith("registry:") and demotion.now == "baseline"
    assert "CALLS" in demotion.error and "ImpureModule" in demotion.error
    assert kd.variants_in_use()["rmsnorm"] == {"float32 " + key_bucket: "baseline"}


# -- outputs never share memory (the judge's side) ----------------------------------------------------

def _ref(buf: int, t: torch.Tensor) -> dict:
    return {"buf": buf, "offset": t.storage_offset(), "shape": list(t.shape), "stride": list(t.stride()),
            "dtype": str(t.dtype).removeprefix("torch.")}


def test_overlapping_outputs_are_found_exactly() -> None:
    b = torch.empty(4, 6)
    assert overlap([_ref(2, b[:, :3]), _ref(2, b[:, 3:])]) is None  # interleaved rows, no shared element
    assert overlap([_ref(2, b[:, :4]), _ref(2, b[:, 3:])]) == (0, 1)
    assert overlap([_ref(2, b), _ref(3, b)]) is None  # other buffers
    assert overlap([_ref(2, b[0].expand(4, 6))]) == (0, 0)  # an output overlapping itself
    flat = b.view(-1)
    assert overlap([_ref(2, flat[1:5]), _ref(2, flat.view(torch.bfloat16)[9:10])]) == (0, 1)  # bytes 4-20, 18-20
    assert overlap([_ref(2, flat[:4]), _ref(2, flat.view(torch.bfloat16)[8:9])]) is None  # bytes 0-16, 16-18


def test_the_judge_calls_outputs_sharing_memory_aliasing() -> None:
    spec = get_op("fused_add_rmsnorm")
    args = spec.make_inputs(spec.test_shapes[0], torch.float32, 0, "cpu")
    expected = spec.reference(*args)
    inputs = [a for a in args if isinstance(a, torch.Tensor)]
    both = torch.empty(2, *expected[0].shape)
    refs = [_ref(len(inputs), both[0]), _ref(len(inputs), both[0])]
    record = {"entries": [], "outputs": refs, "inputs": len(inputs), "problem": None}
    facts = {"error": None, "launches": 1, "torch_ops": [], "violations": [], "count": 2, "types": [], "devices": []}
    v = Verdict(op=spec.name, device="cpu-interpreter", file="x.py", sha256="0")
    judge_call(v, spec, "here", facts, record, [expected[0], expected[0]], [a.clone() for a in inputs], inputs,
               expected, "cpu", spec.test_shapes[0])
    assert v.failure == "aliasing" and "output 0 shares memory with output 1" in v.reason
