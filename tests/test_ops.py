"""Every baseline kernel against its torch reference, through the Triton interpreter on CPU."""

from __future__ import annotations

import json

import pytest
import torch

from kernelloop.kernels import OPS
from kernelloop.kernels.compare import check_impl
from kernelloop.kernels.device import CUDA
from kernelloop.kernels.spec import TOKEN_BUCKETS, Cost, OpSpec, pick_shapes, size_bucket, size_class

from bench.baseline_plan import gpu_order

CASES = [
    pytest.param(spec, shape, dtype, id=f"{name}-{'x'.join(map(str, shape.values()))}-{str(dtype)[6:]}")
    for name, spec in OPS.items()
    for shape in spec.test_shapes
    for dtype in spec.dtypes
]


@pytest.mark.parametrize("spec,shape,dtype", CASES)
@pytest.mark.parametrize("seed", [0, 1])
def test_baseline_matches_reference(spec, shape, dtype, seed):
    result = check_impl(spec, spec.forward, shape, dtype, seed)
    assert result.ok, str(result)


def test_the_op_table_is_every_spec_module_of_kernels_ops():
    """Discovered, not listed: each kernels/ops/<op>.py exporting SPEC is op <op>, whose baseline kernel
    is kernels/ops/<op>_kernel.py; every other module there is some op's kernel file."""
    import pkgutil

    from kernelloop.kernels import ops
    from kernelloop.kernels.ops import baseline_file

    names = {m.name for m in pkgutil.iter_modules(ops.__path__)}
    assert set(OPS) == {n for n in names if not n.endswith("_kernel")} and len(OPS) >= 7
    assert names == set(OPS) | {f"{op}_kernel" for op in OPS}
    for name in OPS:
        assert baseline_file(name).name == f"{name}_kernel.py"


@pytest.mark.parametrize("spec", OPS.values(), ids=list(OPS))
def test_spec_contract(spec):
    import inspect

    assert inspect.signature(spec.forward).parameters.keys() == inspect.signature(spec.reference).parameters.keys()
    assert set(spec.dtypes) == {torch.float32, torch.float16, torch.bfloat16}
    assert spec.signature.startswith(f"{spec.name}(")
    json.dumps(spec.describe())
    keys = set(spec.engine_shapes[0])
    assert all(set(s) == keys for s in spec.engine_shapes + spec.test_shapes)
    assert spec.bucketed <= keys
    for shape in spec.engine_shapes[:3]:
        cost = spec.cost(shape, torch.bfloat16)
        assert cost.bytes > 0 and cost.flops > 0
        assert spec.cost(shape, torch.float32).bytes > cost.bytes  # bytes scale with the dtype


@pytest.mark.parametrize("spec", OPS.values(), ids=list(OPS))
def test_test_shapes_are_odd_and_even(spec):
    sizes = [v for s in spec.test_shapes for v in s.values()]
    assert any(v % 2 for v in sizes if v > 1), "no odd size among the test shapes"
    assert any(v & (v - 1) for v in sizes), "no non-power-of-two size among the test shapes"


@pytest.mark.parametrize("spec", OPS.values(), ids=list(OPS))
def test_inputs_are_seeded_and_realistic(spec):
    shape = spec.test_shapes[-1]
    a = spec.make_inputs(shape, torch.float32, 0, "cpu")
    b = spec.make_inputs(shape, torch.float32, 0, "cpu")
    c = spec.make_inputs(shape, torch.float32, 1, "cpu")
    tensors = [(x, y, z) for x, y, z in zip(a, b, c) if isinstance(x, torch.Tensor) and x.is_floating_point()]
    assert tensors
    # Tables such as rope's cos/sin cache are fixed; the data must change with the seed.
    assert any(not torch.equal(x, z) for x, _, z in tensors), "another seed must give other inputs"
    for x, y, _ in tensors:
        assert torch.equal(x, y), "same seed must give the same inputs"
        assert torch.isfinite(x.float()).all()  # (float8 has no isfinite of its own)
        # scale-free (linear's weights are drawn at std 1/sqrt(K), as Hugging Face initialises them)
        assert x.float().std() > 0.05 * x.float().abs().mean(), "inputs must not be (nearly) constant, e.g. all-ones"
    assert spec.shape_of(*a) == {k: v for k, v in shape.items() if k in spec.shape_of(*a)}


def test_engine_shapes_cover_decode_prefill_and_odd_hidden_sizes():
    shapes = OPS["rmsnorm"].engine_shapes
    assert {1, 8192} <= {s["tokens"] for s in shapes}
    assert {1536, 2880, 5120} <= {s["hidden"] for s in shapes}


def test_size_classes_never_straddle_buckets():
    # The dispatch cache is keyed by size_class; the registry by size_bucket. They must agree.
    seen: dict[int, str] = {}
    for n in range(1, 3 * TOKEN_BUCKETS[-1]):
        assert seen.setdefault(size_class(n), size_bucket(n)) == size_bucket(n), n
    assert size_bucket(1) == "1" and size_bucket(16) == "2-16" and size_bucket(17) == "17-128"
    assert size_bucket(9000) == ">8192"


@pytest.mark.parametrize("spec", OPS.values(), ids=list(OPS))
def test_dispatch_key_agrees_with_bucket(spec):
    buckets: dict[tuple, str] = {}
    for shape in spec.test_shapes:
        for dtype in spec.dtypes:
            args = spec.make_inputs(shape, dtype, 0, "cpu")
            bucket = spec.bucket(spec.shape_of(*args))
            assert buckets.setdefault(spec.dispatch_key(*args), bucket) == bucket


def test_rmsnorm_handles_leading_dims_and_strided_rows():
    spec = OPS["rmsnorm"]
    x, w, eps = spec.make_inputs({"tokens": 6, "hidden": 40}, torch.float32, 3, "cpu")
    x3 = x.view(2, 3, 40)
    torch.testing.assert_close(spec.forward(x3, w, eps), spec.reference(x3, w, eps))
    wide = torch.randn(5, 64)
    strided = wide[:, :40]  # rows with a stride larger than their length
    torch.testing.assert_close(spec.forward(strided, w, eps), spec.reference(strided, w, eps))


# gpu_check's one try has about 100 s for every gpu test. A case draws its inputs on the CPU
# (make_inputs' seeded generator, ~1e8 values/s), compiles its kernels for its shape and dtype (~1-3 s
# each on the host) and computes the reference on the GPU. Each op gets three engine shapes
# (smallest, middle, largest) in bfloat16, the middle one in float16 and the largest in float32;
# where one of the three costs more than GPU_CASE_LIMIT in float32, three spread over the shapes
# within it (linear's largest is 17 TFLOPs with a 1e9-value weight; decode_attention's and
# silu_mul's draw 8e8 and 5e8 values). The tl.dot kernels go first (bench.baseline_plan.gpu_order);
# the interpreter checks every dtype at every test shape, bench.baselines the large shapes in bfloat16.
GPU_CASE_LIMIT = Cost(bytes=1_200_000_000, flops=1_000_000_000_000)


def within_gpu_case_limit(spec: OpSpec, shape: dict[str, int]) -> bool:
    cost = spec.cost(shape, torch.float32)
    return cost.bytes <= GPU_CASE_LIMIT.bytes and cost.flops <= GPU_CASE_LIMIT.flops


def gpu_cases(spec: OpSpec) -> list[tuple[dict[str, int], torch.dtype]]:
    picked = pick_shapes(spec.engine_shapes, 3)
    if not all(within_gpu_case_limit(spec, s) for s in picked):
        picked = pick_shapes([s for s in spec.engine_shapes if within_gpu_case_limit(spec, s)], 3)
    return [(s, torch.bfloat16) for s in picked] + [(picked[1], torch.float16), (picked[-1], torch.float32)]


GPU_CASES = [
    pytest.param(OPS[name], shape, dtype, id=f"{name}-{'x'.join(map(str, shape.values()))}-{str(dtype)[6:]}")
    for name in gpu_order(list(OPS))
    for shape, dtype in gpu_cases(OPS[name])
]


def test_gpu_cases_fit_the_limit_and_cover_every_op_and_dtype():
    for name, spec in OPS.items():
        cases = [(p.values[1], p.values[2]) for p in GPU_CASES if p.values[0] is spec]
        assert len(cases) == 5 and {d for _, d in cases} == set(spec.dtypes), name
        shapes = [s for s, _ in cases]
        assert len({tuple(s.items()) for s in shapes}) == 3, name
        assert all(within_gpu_case_limit(spec, s) and s in list(spec.engine_shapes) for s in shapes), name
    linear = [p.values[1] for p in GPU_CASES if p.values[0].name == "linear"]
    assert min(s["tokens"] for s in linear) == 1 and max(s["tokens"] for s in linear) >= 512  # decode and prefill
    assert [p.values[0].name for p in GPU_CASES[:1]] == ["decode_attention"]


@pytest.mark.gpu
@pytest.mark.parametrize("spec,shape,dtype", GPU_CASES)
def test_baseline_matches_reference_on_cuda_at_engine_shapes(spec, shape, dtype):
    result = check_impl(spec, spec.forward, shape, dtype, seed=0, device=CUDA)
    assert result.ok, str(result)


@pytest.mark.parametrize("name", ["rmsnorm", "fused_add_rmsnorm", "silu_mul", "rope"])
def test_zero_tokens_give_empty_outputs(name):
    spec = OPS[name]
    shape = {**spec.test_shapes[-1], "tokens": 0}
    args = spec.make_inputs(shape, torch.float16, 0, "cpu")
    out, ref = spec.forward(*args), spec.reference(*args)
    for o, r in zip(out if isinstance(out, tuple) else (out,), ref if isinstance(ref, tuple) else (ref,)):
        assert o.shape == r.shape and o.numel() == 0 and o.dtype == r.dtype


def test_rope_accepts_views_into_a_fused_qkv_tensor():
    # The engine's qkv projection is one matmul; q and k are strided views of its output.
    spec = OPS["rope"]
    q, k, positions, cache = spec.make_inputs({"tokens": 3, "q_heads": 4, "kv_heads": 2, "head_dim": 32},
                                              torch.float32, 0, "cpu")
    qkv = torch.cat([q.flatten(1), k.flatten(1), torch.randn(3, 64)], dim=1)
    q_view = qkv[:, :128].view(3, 4, 32)
    k_view = qkv[:, 128:192].view(3, 2, 32)
    assert not q_view.is_contiguous()
    for out, ref in zip(spec.forward(q_view, k_view, positions, cache), spec.reference(q, k, positions, cache)):
        torch.testing.assert_close(out, ref)


def test_silu_mul_and_fused_add_rmsnorm_accept_3d_inputs():
    x = OPS["silu_mul"].make_inputs({"tokens": 6, "d": 40}, torch.float32, 0, "cpu")[0].view(2, 3, 80)
    torch.testing.assert_close(OPS["silu_mul"].forward(x), OPS["silu_mul"].reference(x))
    spec = OPS["fused_add_rmsnorm"]
    x, r, w, eps = spec.make_inputs({"tokens": 6, "hidden": 40}, torch.float32, 0, "cpu")
    out = spec.forward(x.view(2, 3, 40), r.view(2, 3, 40), w, eps)
    ref = spec.reference(x.view(2, 3, 40), r.view(2, 3, 40), w, eps)
    for o, e in zip(out, ref):
        torch.testing.assert_close(o, e)
