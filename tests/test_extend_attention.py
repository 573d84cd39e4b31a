"""The extend_attention op (kernels/ops/extend_attention.py): baseline against reference, its battery,
planted wrong kernels and an sm90 compile. The engine's use of it: tests/test_engine_attention.py."""

from __future__ import annotations

import importlib.util
import inspect
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from kernelloop.kernels.compare import check_impl, check_outputs
from kernelloop.kernels.device import CPU
from kernelloop.kernels.ops import extend_attention as ea
from kernelloop.kernels.ops import extend_attention_kernel
from kernelloop.kernels.spec import Case

SPEC = ea.SPEC
REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning",
                                        "ignore:overflow encountered:RuntimeWarning")


def _id(shape) -> str:
    return "x".join(map(str, shape.values()))


CASES = [pytest.param(shape, dtype, id=f"{_id(shape)}-{str(dtype)[6:]}")
         for shape in SPEC.test_shapes + SPEC.held_back for dtype in SPEC.dtypes]


@pytest.mark.parametrize("shape,dtype", CASES)
@pytest.mark.parametrize("seed", [0, 1])
def test_baseline_matches_reference(shape, dtype, seed):
    result = check_impl(SPEC, SPEC.forward, shape, dtype, seed)
    assert result.ok, str(result)


@pytest.mark.parametrize("dtype", SPEC.dtypes, ids=lambda d: str(d)[6:])
def test_baseline_passes_its_whole_cpu_battery(dtype):
    start = time.perf_counter()
    failed = [r for c in SPEC.battery(CPU)
              if not (r := check_impl(SPEC, SPEC.forward, c.shape, dtype, 0, variant=c.variant)).ok]
    assert not failed, "\n".join(map(str, failed))
    print(f"extend_attention {dtype} CPU battery: {time.perf_counter() - start:.1f} s")


# Tiles other than the interpreter's default: a block of fewer tokens than a K/V tile (phase 2 ends
# inside the diagonal tile), and the GPU configurations themselves.
@pytest.mark.parametrize("block_m,block_n", [(32, 32), (64, 16), (128, 32), (16, 64)])
def test_other_tiles_match_reference(block_m, block_n):
    def impl(*args):
        return extend_attention_kernel.launch(*args, BLOCK_M=block_m, BLOCK_N=block_n)

    for shape in (SPEC.test_shapes[1], SPEC.test_shapes[3], SPEC.held_back[1]):
        for dtype in (torch.float32, torch.bfloat16):
            result = check_impl(SPEC, impl, shape, dtype, 2)
            assert result.ok, str(result)


# --- What the op means ---------------------------------------------------------------------------


def brute_force(q, k, v, k_buffer, v_buffer, qo_indptr, kv_indptr, kv_indices, sm_scale):
    """One (token, head) at a time in float64: the definition, independent of the reference's batched matmuls."""
    T, Hq, D = q.shape
    G = Hq // k.shape[1]
    out = torch.zeros(T, Hq, D, dtype=torch.float64)
    qo, kvp = qo_indptr.tolist(), kv_indptr.tolist()
    for b in range(len(qo) - 1):
        slots = kv_indices[kvp[b]:kvp[b + 1]].tolist()
        for i in range(qo[b + 1] - qo[b]):
            t = qo[b] + i
            for h in range(Hq):
                kh = h // G
                keys = [k_buffer[s, kh] for s in slots] + [k[qo[b] + j, kh] for j in range(i + 1)]
                vals = [v_buffer[s, kh] for s in slots] + [v[qo[b] + j, kh] for j in range(i + 1)]
                scores = torch.stack([q[t, h].double() @ key.double() for key in keys]) * sm_scale
                out[t, h] = torch.softmax(scores, 0) @ torch.stack(vals).double()
    return out


def hand_built(dtype, new=(3, 0, 5, 1), prefixes=(4, 2, 0, 3), Hq=6, Hk=2, D=24, seed=7):
    """Requests with and without new tokens and prefixes, prefix slots shuffled over a larger pool."""
    g = torch.Generator().manual_seed(seed)
    T, P = sum(new), sum(prefixes)
    num_slots = P + 9
    q, k, v = (torch.randn(T, h, D, generator=g) for h in (Hq, Hk, Hk))
    kb, vb = torch.randn(num_slots, Hk, D, generator=g), torch.randn(num_slots, Hk, D, generator=g)
    kv_indices = torch.randperm(num_slots, generator=g)[:P]
    qo_indptr = torch.tensor((0,) + new).cumsum(0).to(torch.int32)
    kv_indptr = torch.tensor((0,) + prefixes).cumsum(0).to(torch.int32)
    return (q.to(dtype), k.to(dtype), v.to(dtype), kb.to(dtype), vb.to(dtype), qo_indptr, kv_indptr, kv_indices, 0.3)


def test_reference_is_the_definition_with_empty_requests_and_prefixes():
    args = hand_built(torch.float32)
    torch.testing.assert_close(SPEC.reference(*args).double(), brute_force(*args), atol=1e-5, rtol=1e-5)
    out = SPEC.forward(*args)
    assert check_outputs(SPEC, out, SPEC.reference(*args), torch.float32).ok
    # A request's first new token with no prefix sees only itself.
    q, k, v, kb, vb, qo, kvp, idx, scale = hand_built(torch.float32, new=(4,), prefixes=(0,))
    torch.testing.assert_close(SPEC.forward(q, k, v, kb, vb, qo, kvp, idx, scale)[0],
                               v[0].repeat_interleave(3, dim=0))  # head h uses kv head h // 3


def test_reference_in_row_chunks_is_the_same(monkeypatch):
    # Engine shapes hold a few hundred query rows' scores at a time; the chunking must not show.
    args = SPEC.make_inputs(SPEC.test_shapes[1], torch.float32, 0, "cpu")
    whole = SPEC.reference(*args)
    monkeypatch.setattr(ea, "REFERENCE_CHUNK", 3000)  # 1-4 rows per chunk here
    torch.testing.assert_close(SPEC.reference(*args), whole, atol=1e-6, rtol=1e-6)


def test_new_tokens_only_see_their_own_request():
    # Changing request 0's K/V (prefix and new) changes no row of request 1, and vice versa.
    args = list(hand_built(torch.float32, new=(5, 6), prefixes=(3, 4)))
    before = SPEC.forward(*args)
    args[1] = args[1].clone()
    args[1][:5] += 1.0
    args[3] = args[3].clone()
    args[3][args[7][:3]] += 1.0
    after = SPEC.forward(*args)
    assert torch.equal(before[5:], after[5:]) and not torch.equal(before[:5], after[:5])


def test_zero_tokens_and_rows_past_the_last_request():
    q, k, v, kb, vb, qo, kvp, idx, scale = hand_built(torch.float32)
    empty = SPEC.forward(q[:0], k[:0], v[:0], kb, vb, torch.zeros(1, dtype=torch.int32), kvp[:1], idx[:0], scale)
    assert empty.shape == (0, 6, 24)
    # kv_indices longer than kv_indptr[-1]: the tail is never read.
    padded = torch.cat([idx, torch.full((5,), 10**9)])
    torch.testing.assert_close(SPEC.forward(q, k, v, kb, vb, qo, kvp, padded, scale),
                               SPEC.forward(q, k, v, kb, vb, qo, kvp, idx, scale), atol=0, rtol=0)


# --- The spec's contract -------------------------------------------------------------------------


def test_shapes_invert_bucket_and_cost():
    for shape in SPEC.test_shapes + SPEC.held_back + (SPEC.many_rows,) + SPEC.variant_shapes:
        for variant in [None] + [dict(v) for v in SPEC.variants]:
            args = SPEC.make_inputs(shape, torch.float16, 3, "cpu", variant)
            assert SPEC.shape_of(*args) == shape, variant
            assert int(args[5][-1]) == shape["tokens"] and args[0].shape[0] == shape["tokens"]
    buckets: dict[tuple, str] = {}
    for shape in SPEC.test_shapes + SPEC.held_back:
        for dtype in SPEC.dtypes:
            args = SPEC.make_inputs(shape, dtype, 0, "cpu")
            bucket = SPEC.bucket(SPEC.shape_of(*args))
            assert buckets.setdefault(SPEC.dispatch_key(*args), bucket) == bucket
    assert SPEC.bucket(SPEC.engine_shapes[0]) == "batch=1,head_dim=64,kv_heads=8,prefix=1,q_heads=32,tokens=129-1024"
    # FLOPs: 4 Hq D per visible (query, key) pair; one request of 3 new tokens after 5: 3*5 + 6 pairs.
    one = {"batch": 1, "tokens": 3, "prefix": 5, "q_heads": 2, "kv_heads": 1, "head_dim": 8}
    assert SPEC.cost(one, torch.float32).flops == 4 * 2 * 8 * (15 + 6)
    for shape in SPEC.engine_shapes[:3]:
        assert SPEC.cost(shape, torch.float32).bytes > SPEC.cost(shape, torch.bfloat16).bytes > 0
    json.dumps(SPEC.describe())


def test_inputs_are_ragged_seeded_and_scattered():
    shape = SPEC.test_shapes[2]  # 4 requests, 21 new tokens, 17 prefix tokens each on average
    a = SPEC.make_inputs(shape, torch.float32, 0, "cpu")
    b = SPEC.make_inputs(shape, torch.float32, 0, "cpu")
    c = SPEC.make_inputs(shape, torch.float32, 1, "cpu")
    assert all(torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y for x, y in zip(a, b))
    assert not torch.equal(a[0], c[0])
    new = (a[5][1:] - a[5][:-1]).tolist()
    prefixes = (a[6][1:] - a[6][:-1]).tolist()
    assert 1 in new and min(new) >= 1 and len(set(new)) > 1
    assert 0 in prefixes and sum(prefixes) == 4 * 17 and prefixes[new.index(1)] > 0
    assert a[7].dtype == torch.int64 and a[5].dtype == a[6].dtype == torch.int32
    assert a[7].unique().numel() == a[7].numel() and a[3].shape[0] > a[7].numel()
    assert not torch.equal(a[7].sort().values, a[7])  # shuffled slots
    # Variants: validated, and they change what they say.
    v = SPEC.variant_shapes[0]
    assert int(SPEC.make_inputs(v, torch.float32, 0, "cpu", {"prefix": "empty"})[6].abs().sum()) == 0
    assert 0 in (lambda x: (x[1:] - x[:-1]).tolist())(SPEC.make_inputs(v, torch.float32, 0, "cpu",
                                                                        {"lengths": "empty"})[5])
    q, k, vv = SPEC.make_inputs(v, torch.float32, 0, "cpu", {"layout": "qkv"})[:3]
    assert not q.is_contiguous() and q.stride(0) == k.stride(0) == vv.stride(0) == (4 + 2 * 2) * 32
    with pytest.raises(ValueError, match="unknown input variant"):
        SPEC.make_inputs(v, torch.float32, 0, "cpu", {"no_such_variant": True})
    with pytest.raises(ValueError, match="bad value"):
        SPEC.make_inputs(v, torch.float32, 0, "cpu", {"prefix": "full"})


def test_battery_and_engine_shapes():
    cases = SPEC.battery(CPU)
    assert len(cases) <= 14 and Case(dict(SPEC.many_rows)) in cases
    assert SPEC.many_rows["tokens"] > 16
    assert SPEC.tf32 is False
    sizes = [v for s in SPEC.test_shapes for v in s.values()]
    assert any(v % 2 for v in sizes if v > 1) and {48, 80} <= {s["head_dim"] for s in SPEC.test_shapes}
    assert any(s["q_heads"] == s["kv_heads"] for s in SPEC.test_shapes)
    assert any(s["q_heads"] > s["kv_heads"] for s in SPEC.test_shapes)
    engine = SPEC.engine_shapes
    assert {512, 2048, 8192} == {s["tokens"] for s in engine} and {0, 2048} == {s["prefix"] for s in engine}
    assert {"batch", "tokens", "prefix"} == SPEC.bucketed
    assert all(set(s) == set(engine[0]) for s in engine + SPEC.test_shapes + SPEC.held_back)


# --- Planted wrong kernels: each is caught by the battery ---------------------------------------

SOURCE = inspect.getsource(extend_attention_kernel)  # the baseline kernel file

MUTANTS = {
    "query i sees new token i + 1": ("(offs_n[None, :] <= tok[:, None])", "(offs_n[None, :] <= tok[:, None] + 1)"),
    "query i does not see itself": ("(offs_n[None, :] <= tok[:, None])", "(offs_n[None, :] < tok[:, None])"),
    "drops the last prefix token": ("mask_n = offs_n < prefix_len\n", "mask_n = offs_n < prefix_len - 1\n"),
    "reads one prefix slot too many": ("prefix_len = tl.load(kv_indptr_ptr + b + 1).to(tl.int64) - kv_start\n",
                                       "prefix_len = tl.load(kv_indptr_ptr + b + 1).to(tl.int64) - kv_start + 1\n"),
    "query head h uses kv head h % Hk": ("head = kv_head * G + offs_g\n",
                                         "head = offs_g * tl.num_programs(1) + kv_head\n"),
    "TF32 dots for float32": ('precision = "ieee" if q.dtype == torch.float32 else "tf32"', 'precision = "tf32"'),
    "ignores sm_scale": ("sm_scale, B, B.bit_length()", "1 / D ** 0.5, B, B.bit_length()"),
}


def mutant(name: str | None, tmp_path: Path):
    """The op's forward from a copy of its source with one mutation applied (None: none)."""
    source = SOURCE
    if name is not None:
        old, new = MUTANTS[name]
        assert SOURCE.count(old) == 1, f"the mutation site of {name!r} is gone from the kernel: update the test"
        source = SOURCE.replace(old, new)
    path = tmp_path / f"extend_attention_mutant_{list(MUTANTS).index(name) if name else 'none'}.py"
    path.write_text(source)  # @triton.jit needs its source in a file
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if name != "reads one prefix slot too many":
        return module.forward

    def padded(q, k, v, kb, vb, qo, kvp, idx, scale):  # a valid extra slot, so the read stays in bounds
        return module.forward(q, k, v, kb, vb, qo, kvp, torch.cat([idx, idx.new_zeros(1)]), scale)

    return padded


@pytest.mark.parametrize("name", list(MUTANTS))
def test_planted_wrong_kernel_is_caught(name, tmp_path):
    forward = mutant(name, tmp_path)
    for case in SPEC.battery(CPU):
        result = check_impl(SPEC, forward, case.shape, torch.float32, 0, variant=case.variant)
        if not result.ok:
            assert "outside atol" in result.reason, result.reason
            return
    pytest.fail(f"the battery missed the planted bug: {name}")


def test_the_unmutated_copy_passes(tmp_path):
    """The mutation, not the copying, is what fails above."""
    forward = mutant(None, tmp_path)
    for case in (Case(dict(SPEC.test_shapes[1])), Case(dict(SPEC.variant_shapes[0]), {"sm_scale": "seeded"})):
        result = check_impl(SPEC, forward, case.shape, torch.float32, 0, variant=case.variant)
        assert result.ok, str(result)


# --- sm90 on CPU ---------------------------------------------------------------------------------

_COMPILE = r'''
import json, torch
from kernelloop.kernels.ops import extend_attention as ea
from kernelloop.kernels.target_compile import capture_launches, compile_launch, meta_inputs
out = []
shape = {"batch": 4, "tokens": 2048, "prefix": 2048, "q_heads": 32, "kv_heads": 8, "head_dim": 128}  # llama-3-8b
for dtype in (torch.bfloat16, torch.float32):
    with capture_launches() as launches:  # meta tensors: a launcher that reads lengths on the host fails here
        ea.SPEC.forward(*meta_inputs(ea.SPEC, shape, dtype))
    r = compile_launch(launches[0], "sm90")
    out.append({"dtype": str(dtype), "launches": len(launches), "constexprs": r.constexprs,
                "registers": r.registers, "spills": r.spill_bytes, "shared": r.shared_bytes, "problem": r.problem})
print(json.dumps(out))
'''


def test_baseline_compiles_for_sm90_without_spills(tmp_path):
    from kernelloop.sandbox.judge.executables import ptxas

    if ptxas() is None:
        pytest.skip("this triton build has no bundled ptxas")
    script = tmp_path / "compile_extend_attention.py"
    script.write_text(_COMPILE)
    env = {**os.environ, "TRITON_INTERPRET": "0", "PYTHONPATH": str(REPO), "TRITON_DEFAULT_FP_FUSION": "1"}
    proc = subprocess.run([sys.executable, str(script)], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    for r in results:
        print(r)
        assert r["launches"] == 1 and r["problem"] is None, r
        assert r["spills"] == 0 and 0 < r["registers"] <= 255 and r["shared"] <= 232448, r
