"""Memory safety in the sandbox: address checks in the interpreter, guard zones, whole-storage input
checks, poisoning that varies, and literals a launcher builds from Python ints.

In-process (the mechanism, not the isolation): a call recorded as the runner records it, replayed as
the replayer replays it. Judge-level cases are the m5_*/m2_* files of tests/sandbox_candidates/.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from kernelloop.kernels import interpreter_bounds as bounds
from kernelloop.kernels.device import CPU
from kernelloop.sandbox.inside import poison, trace
from kernelloop.sandbox.inside.replay import Replay, ReplayError, kernels_from_source
from kernelloop.sandbox.inside.worker import load_module
from kernelloop.sandbox.judge import decisions as judge
from kernelloop.sandbox.verdict import FAILURES, Verdict

STATE: dict = {"recorder": None}
trace.install_launch_hook(STATE)

# One kernel, one access pattern per MODE: 0 is honest; every other mode touches memory it was not given.
SOURCE = '''
import torch
import triton
import triton.language as tl

@triton.jit
def _k(x_ptr, y_ptr, n, stride, MODE: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    far = tl.where(mask, offs, offs * 1000003 - 99 * n)  # masked lanes point anywhere
    x = tl.load(x_ptr + row * stride + far, mask=mask, other=0.0)
    if MODE == 1:  # store one element past the output
        tl.store(y_ptr + row * n + offs, x, mask=offs <= n)
    else:
        tl.store(y_ptr + row * n + far, x, mask=mask)
    if MODE == 2:  # load past the input's last row
        x = tl.load(x_ptr + row * stride + offs)
    if MODE == 3:  # load one element before the input
        x = tl.load(x_ptr + row * stride + offs - 1, mask=mask)
    if MODE == 4:  # store into the input's padding (strided rows)
        tl.store(x_ptr + row * stride + n, 1.0)
    if MODE == 5:  # atomic just past the output
        tl.atomic_add(y_ptr + n * tl.num_programs(0), 1.0)
    if MODE == 6:  # the last element read 8 bytes wide: half of it past the input
        tl.load((x_ptr + (tl.num_programs(0) - 1) * stride + n - 1).to(tl.pointer_type(tl.int64)))
    if MODE == 7:  # store 4 bytes before the output
        tl.store(y_ptr - 1, 0.0)

def forward(x, mode):
    rows, n = x.shape
    y = torch.empty((rows, n), dtype=x.dtype)
    _k[(rows,)](x, y, n, x.stride(0), MODE=mode, BLOCK=triton.next_power_of_2(n))
    return y
'''
FORWARD, CONSTANTS = load_module(SOURCE, "bounds_modes.py")
KERNELS = kernels_from_source(SOURCE, CONSTANTS)


def _record(forward, args: tuple) -> tuple:
    rec = trace.Recorder()
    rec.begin(args)
    STATE["recorder"] = rec
    try:
        with rec:
            out = forward(*args)
    finally:
        STATE["recorder"] = None
    return out, json.loads(json.dumps(rec.finish(out)))


def _fresh(args: tuple) -> list[torch.Tensor]:
    """Copies of the tensor inputs, each with a storage of its own, as the channel delivers them."""
    return [torch.empty(0, dtype=a.dtype).set_(a.untyped_storage().clone(), a.storage_offset(), a.shape, a.stride())
            for a in args if isinstance(a, torch.Tensor)]


def _strided(rows: int = 3, n: int = 5, pad: int = 3) -> torch.Tensor:
    return torch.randn(rows, n + pad)[:, :n]


def _as_mode(record: dict, mode: int) -> dict:
    forged = json.loads(json.dumps(record))
    for entry in forged["entries"]:
        if entry["kind"] == "launch":
            entry["kwargs"]["MODE"] = {"constexpr": mode}
    return forged


# -- the checker itself ---------------------------------------------------------------------------


def test_view_intervals_are_the_elements_of_the_view() -> None:
    base = torch.zeros(4, 10)
    addr = base.untyped_storage().data_ptr()
    starts, ends = bounds.tensor_intervals(base[:, 2:5])  # 4 rows of 3 elements
    assert (starts - addr).tolist() == [8, 48, 88, 128] and (ends - starts).tolist() == [12] * 4
    starts, ends = bounds.tensor_intervals(base.t())  # a transpose is the same bytes, one run
    assert (starts - addr).tolist() == [0] and (ends - addr).tolist() == [160]
    starts, _ = bounds.tensor_intervals(base[:1].expand(5, 10))  # a broadcast row is its one row
    assert (starts - addr).tolist() == [0]
    assert bounds.tensor_intervals(base[:, :0])[0].size == 0


def test_only_enabled_lanes_count_and_each_lane_needs_its_full_width() -> None:
    import triton.language as tl

    class Handle:
        def __init__(self, data, ty=tl.float32) -> None:
            self.data, self.ty = data, ty

        def get_element_ty(self):
            return self.ty

    base = 1 << 40
    launch = bounds.Launch("k", [("x_ptr", base, 4, bounds.span(base, 64)), ("y_ptr", base + 4096, 4,
                                                                            bounds.span(base + 4096, 8))])
    lanes = np.array([base, base + 60, base + 4096, base + 4100, 7, base + 64], dtype=np.uint64)
    launch.check(Handle(lanes), Handle(np.array([1, 1, 1, 1, 0, 0], dtype=bool)), "load from")
    with pytest.raises(bounds.OutOfBounds, match=r"kernel k: load from x_ptr\[\+16\] \(4 bytes\)"):
        launch.check(Handle(lanes), Handle(np.array([1, 1, 1, 1, 0, 1], dtype=bool)), "load from")
    with pytest.raises(bounds.OutOfBounds, match=r"y_ptr\[\+1\] \(8 bytes\)"):  # 4 bytes in, 4 past
        launch.check(Handle(np.array([base + 4100], dtype=np.uint64), tl.int64), None, "load from")
    with pytest.raises(bounds.OutOfBounds, match=r"x_ptr\[-1\]"):
        launch.check(Handle(np.array([base - 4], dtype=np.uint64)), None, "store to")
    with pytest.raises(bounds.OutOfBounds):  # an address past 2**63 is no wrap-around back inside
        launch.check(Handle(np.array([(1 << 64) - 2], dtype=np.uint64)), None, "store to")


# -- the runner and the replay on real launches ------------------------------------------------------


@pytest.mark.parametrize("mode, message", [
    (1, r"store to y_ptr\[\+15\]"),
    (2, r"load from x_ptr\[\+15\]"),
    (3, r"load from x_ptr\[-1\]"),
    (4, r"store to x_ptr\[\+5\]"),
    (5, r"atomic on y_ptr\[\+15\]"),
    (6, r"load from x_ptr\[\+14\] \(8 bytes\)"),
    (7, r"store to y_ptr\[-1\]"),
])
def test_every_kind_of_bad_access_is_refused_in_the_runner_and_in_the_replay(mode: int, message: str) -> None:
    x = _strided() if mode == 4 else torch.randn(3, 5)
    with pytest.raises(bounds.OutOfBounds, match=message):  # the runner: forward raises, nothing is corrupted
        _record(FORWARD, (x, mode))
    out, record = _record(FORWARD, (x, 0))
    with pytest.raises(bounds.OutOfBounds, match="kernel _k: " + message):  # the replay of the same launch
        Replay(KERNELS, CPU).run(_as_mode(record, mode), _fresh((x,)))
    assert torch.equal(Replay(KERNELS, CPU).run(record, _fresh((x,)))[0], out)


def test_masked_lanes_far_outside_and_strided_views_pass() -> None:
    x = _strided()
    out, record = _record(FORWARD, (x, 0))
    assert record["problem"] is None and torch.equal(out, x)
    assert judge.same_bits(Replay(KERNELS, CPU).run(record, _fresh((x,)))[0], out)


def test_guard_zones_catch_a_store_past_an_allocation_without_address_checks() -> None:
    """The layer that works on a GPU: no address is checked, the guard zone shows the store."""
    x = torch.randn(3, 5)
    _, record = _record(FORWARD, (x, 0))
    for mode, where in ((1, r"byte \+60"), (7, "byte -4")):
        replay = Replay(KERNELS, CPU, check_addresses=False)
        replay.run(_as_mode(record, mode), _fresh((x,)))
        with pytest.raises(bounds.OutOfBounds, match=where + r" of buffer 1, which has 60 bytes \(made by aten.empty"):
            replay.check_guards()
    replay = Replay(KERNELS, CPU, check_addresses=False)
    replay.run(record, _fresh((x,)))
    replay.check_guards()


# -- what the judge makes of it -----------------------------------------------------------------------


def _verdict() -> Verdict:
    return Verdict(op="rmsnorm", device="cpu-interpreter", file="f.py", sha256="0")


def test_the_judge_compares_the_whole_storage_behind_every_input() -> None:
    fused = torch.randn(4, 12)
    q, k = fused[:, :4], fused[:, 4:8]
    sent = _fresh((q, k))
    v = _verdict()
    assert not judge.input_changes(v, "t", [q, k], sent, "the call") and v.failure is None
    judge.storage_bytes(sent[0])[32:36] = 1  # k's part of the fused buffer, through q's copy
    assert judge.input_changes(v, "t", [q, k], sent, "the call")
    assert v.failure == "out-of-bounds" and "outside input 0's view (byte 32 of the 192-byte buffer" in v.reason
    v, sent = _verdict(), _fresh((q, k))
    sent[1][0, 0] = 7.0
    judge.input_changes(v, "t", [q, k], sent, "the kernels")
    assert v.failure == "input-mutated" and v.reason == "t: the kernels changed input 1"


def test_bounds_failures_are_recognised_wherever_they_surface() -> None:
    assert "out-of-bounds" in FAILURES and FAILURES.index("out-of-bounds") == FAILURES.index("input-mutated") + 1
    text = "kernelloop.kernels.interpreter_bounds.OutOfBounds: kernel _k: store to y_ptr[+15] (4 bytes), outside"
    assert judge.bounds_code(text, "untraceable") == ("out-of-bounds", "kernel _k: store to y_ptr[+15] (4 bytes), outside")
    assert judge.bounds_code("ValueError: bad", "raised") == ("raised", "ValueError: bad")
    v = _verdict()
    judge.runtime_failure(v, {"violations": [], "error": text}, "t")
    assert v.failure == "out-of-bounds" and v.reason.startswith("t: forward raised kernel _k: store to y_ptr[+15]")


# -- poison --------------------------------------------------------------------------------------------


def test_poison_varies_per_allocation_and_covers_the_whole_storage() -> None:
    seen = {dtype: set() for dtype in (torch.float32, torch.int32)}
    sentinel = 0x5A5A5A5A
    for dtype in seen:
        for _ in range(60):
            t = torch.empty_strided((3, 4), (8, 1), dtype=dtype)  # gaps between rows: still poisoned
            words = torch.empty(0, dtype=torch.int32).set_(t.untyped_storage())
            words.fill_(sentinel)
            seen[dtype].add(poison.fill(t.untyped_storage(), dtype))
            assert words.numel() == 20 and not (words == sentinel).any()
    assert seen[torch.float32] == set(poison.FLOAT_PATTERNS) and seen[torch.int32] == set(poison.INT_PATTERNS)


def test_a_kernel_reading_memory_it_never_wrote_differs_between_runner_and_replay() -> None:
    """Correct only where a fresh output holds NaN (it stores where `old != old`): under a fixed NaN
    poison the runner and the replay agree; under varied poison they do not."""
    source = SOURCE.replace("    if MODE == 1:", "    old = tl.load(y_ptr + row * n + offs, mask=mask)\n    if MODE == 1:")
    source = source.replace("        tl.store(y_ptr + row * n + far, x, mask=mask)",
                            "        tl.store(y_ptr + row * n + far, x, mask=mask & (old != old))")
    forward, constants = load_module(source, "nan_probe.py")
    replay = Replay(kernels_from_source(source, constants), CPU)
    x = torch.randn(2, 8)
    differ = 0
    for _ in range(8):
        out, record = _record(forward, (x, 0))
        differ += not judge.same_bits(replay.run(record, _fresh((x,)))[0], out)
    assert differ  # all 8 alike by chance: about 1e-9


# -- literals: index data a launcher builds from Python ints -------------------------------------------


LITERAL_SOURCE = '''
import torch
import triton
import triton.language as tl

@triton.jit
def _gather(x_ptr, idx_ptr, y_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    i = tl.load(idx_ptr + offs)
    tl.store(y_ptr + offs, tl.load(x_ptr + i))

def forward(x, how):
    idx = torch.empty(4, dtype=torch.int32, device=x.device)
    idx[0] = x.numel() - 1
    idx[1:3] = 2
    idx[3] = 0
    if how == "list":
        idx = torch.tensor([3, 2, 1, 0], dtype=torch.int32)
    if how == "floats":  # outputs computed in Python, written element by element
        y = torch.empty(4)
        for j, v in enumerate(x[:4].tolist()):
            y[j] = v * 2.0
        return y
    if how == "too_many":
        big = torch.empty(300, dtype=torch.int64)
        for j in range(300):
            big[j] = j
    y = torch.empty(4, dtype=x.dtype, device=x.device)
    _gather[(1,)](x, idx, y, BLOCK=4)
    return y
'''


def test_index_data_set_from_python_ints_is_recorded_and_replayed() -> None:
    forward, constants = load_module(LITERAL_SOURCE, "literal.py")
    replay = Replay(kernels_from_source(LITERAL_SOURCE, constants), CPU)
    x = torch.randn(9)
    for how in ("ints", "list"):
        out, record = _record(forward, (x, how))
        assert record["problem"] is None, record["problem"]
        assert any(e["kind"] == "literal" for e in record["entries"])
        assert judge.same_bits(replay.run(record, _fresh((x,)))[0], out)
    assert out.tolist() == x[[3, 2, 1, 0]].tolist()


@pytest.mark.parametrize("how, problem", [
    ("floats", "floating-point tensor made from Python values"),
    ("too_many", "more than 256 values written into tensors from Python"),
])
def test_python_computed_data_stays_untraceable(how: str, problem: str) -> None:
    forward, _ = load_module(LITERAL_SOURCE, "literal.py")
    _, record = _record(forward, (torch.randn(9), how))
    assert problem in (record["problem"] or "")


@pytest.mark.parametrize("forge, message", [
    (lambda e: e.update(dtype="float32"), "integer or bool"),
    (lambda e: e.update(values=[1.5] * len(e["values"])), "malformed literal"),
    (lambda e: e.update(values=e["values"] * 2), "malformed literal"),
    (lambda e: e.update(dtype="int8", values=[300] * len(e["values"])), "do not fit"),
    (lambda e: e.update(shape=[300], values=list(range(300))), "more than 256 values"),
])
def test_a_forged_literal_is_refused_by_the_replay(forge, message: str) -> None:
    forward, constants = load_module(LITERAL_SOURCE, "literal.py")
    x = torch.randn(9)
    _, record = _record(forward, (x, "ints"))
    forge(next(e for e in record["entries"] if e["kind"] == "literal"))
    with pytest.raises(ReplayError, match=message):
        Replay(kernels_from_source(LITERAL_SOURCE, constants), CPU).run(record, _fresh((x,)))


def test_a_forged_record_cannot_fill_an_output_from_python() -> None:
    """More Python values than the cap, as fills of single elements, are refused by the replay itself."""
    x = torch.randn(3, 5)
    _, record = _record(FORWARD, (x, 0))
    fill = {"kind": "aten", "op": "aten.fill_.Scalar", "kwargs": {}, "new": [None],
            "args": [{"tensor": {"buf": 1, "offset": 0, "shape": [], "stride": [], "dtype": "float32"}}, 0.5]}
    record["entries"] += [fill] * 257
    with pytest.raises(ReplayError, match="more than 256 values"):
        Replay(KERNELS, CPU).run(record, _fresh((x,)))


def test_inference_mode_records_what_plain_mode_records() -> None:
    """The runner calls forward under inference_mode, as the engine does; composite ops then reach the
    recorder whole (a copying reshape, contiguous, item): they must be seen as their decomposition."""
    def launcher(x):
        y = x.contiguous().reshape(-1)
        idx = torch.empty(2, dtype=torch.int32)
        idx[0] = int(x[0, 0].item() > 0)
        return y.flatten(), idx

    records = []
    for inference in (False, True):
        with torch.inference_mode(inference):
            x = _strided()
            rec = trace.Recorder()
            rec.begin((x,))
            with rec:
                launcher(x)
            assert not rec.forbidden and rec.problem is None
            records.append([e.get("op", e["kind"]) for e in rec.entries])
    assert records[0] == records[1] and "aten.clone.default" in records[0]
