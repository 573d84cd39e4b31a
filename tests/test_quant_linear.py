"""The quantized linear ops (kernels/ops/linear_int8.py, linear_int4.py, linear_fp8.py): each baseline's
scaling on both code paths (tiles, split-K) against its scheme's exact reference, each scheme's
round-trip error, the int4 packing layout pinned by hand, the judge's verdict on each baseline, and
planted wrong kernels (scales ignored, nibbles swapped, one group's scale for all) refused by it."""

from __future__ import annotations

import json

import pytest
import torch

from kernelloop.agent.cli import main
from kernelloop.kernels import OPS
from kernelloop.kernels.ops import baseline_source, linear_fp8_kernel, linear_int4_kernel, linear_int8_kernel
from kernelloop.kernels.quant import SCHEMES, dequantize_int4, quantize_int4

QUANT_OPS = ("linear_int8", "linear_int4", "linear_fp8")
DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _rel_rms(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).pow(2).mean().sqrt() / b.pow(2).mean().sqrt())


# --- the baselines against their references -------------------------------------------------------
# Every test shape in every dtype (tests/test_ops.py), the whole CPU battery in every dtype and the range
# cases (tests/test_battery.py) run for these ops as for every op of the table; here, what is theirs alone.


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("splits", [1, 3])
def test_both_paths_scale_right(splits, dtype):
    """The scale lands in the epilogue (int8, fp8: unsplit) or in the split-K reduction, and int4's groups
    stay whole when K is split: forced split counts against the reference, with a bias."""
    shape = {"tokens": 3, "n": 20, "k": 384}  # int4: three groups of 128, split into one slice each
    for name, kernel in (("linear_int8", linear_int8_kernel), ("linear_int4", linear_int4_kernel),
                         ("linear_fp8", linear_fp8_kernel)):
        spec = OPS[name]
        args = spec.make_inputs(shape, dtype, 5, "cpu", {"bias": True})
        got = kernel.launch(*args, split_k=splits)
        tol = spec.tolerance(dtype, shape)
        torch.testing.assert_close(got, spec.reference(*args), atol=tol.atol, rtol=tol.rtol)


def test_shapes_and_engine_shapes_fit_the_schemes():
    for name in QUANT_OPS:
        spec = OPS[name]
        scheme = SCHEMES[name.removeprefix("linear_")]
        shapes = (*spec.test_shapes, *spec.held_back, *spec.variant_shapes, spec.many_rows, *spec.range_shapes)
        assert all(scheme.applies(s["k"]) for s in shapes + spec.engine_shapes)
        assert spec.engine_shapes == tuple(s for s in OPS["linear"].engine_shapes if scheme.applies(s["k"]))
        # The roofline's bytes are the quantized weight's: int4 reads about a quarter of bfloat16's weight.
        big = {"tokens": 1, "n": 4096, "k": 4096}
        ratio = spec.cost(big, torch.bfloat16).bytes / OPS["linear"].cost(big, torch.bfloat16).bytes
        assert scheme.bits / 16 < ratio < 1.1 * scheme.bits / 16, name  # plus the scales, x and y


# --- the schemes ----------------------------------------------------------------------------------


@pytest.mark.parametrize("scheme,bound", [("int8", 0.01), ("int4", 0.15), ("fp8", 0.05)])
def test_the_round_trip_error_is_bounded(scheme, bound):
    """Relative RMS error of quantize -> dequantize on a linear weight (N(0, 1/K), K = 576: int4 groups
    of 64), and requantizing a dequantized weight gives it back exactly."""
    s = SCHEMES[scheme]
    weight = OPS["linear"].make_inputs({"tokens": 1, "n": 256, "k": 576}, torch.float32, 0, "cpu")[1]
    q, scales = s.quantize(weight)
    back = s.dequantize(q, scales)
    assert _rel_rms(back, weight) < bound
    assert _rel_rms(back, weight) > bound / 100  # it is quantized at all
    assert torch.equal(s.dequantize(*s.quantize(back)), back)


def test_the_int4_packing_layout_is_pinned():
    """Byte j holds k = 2j in its low nibble and k = 2j + 1 in its high one, each as q + 8."""
    qweight = torch.tensor([[0x9F, 0x70]], dtype=torch.uint8)  # nibbles (low, high): (15, 9), (0, 7)
    w = dequantize_int4(qweight, torch.tensor([[0.5]]))
    assert w.tolist() == [[3.5, 0.5, -4.0, -0.5]]  # q = 7, 1, -8, -1

    weight = torch.zeros(1, 64)
    weight[0, :4] = torch.tensor([3.5, 0.5, -3.5, -0.5])  # absmax 3.5: scale 0.5, q = 7, 1, -7, -1
    packed, scales = quantize_int4(weight)
    assert packed.shape == (1, 32) and scales.tolist() == [[0.5]]
    assert packed[0, :3].tolist() == [0x9F, 0x71, 0x88]
    y = OPS["linear_int4"].forward(torch.eye(64)[:4], packed, scales, None)  # row m reads w[0, m]
    assert y[:, 0].tolist() == [3.5, 0.5, -3.5, -0.5]


# --- the judge ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name, kernel", [("linear_int8", linear_int8_kernel), ("linear_int4", linear_int4_kernel)])
def test_the_interpreters_wide_tiles_cross_their_edges_right(name, kernel):
    """CPU tensors get the interpreter's wide tiling (64 x 4096 at most); past both edges (rows and columns that
    wrap onto valid ones, a second tile in each direction) the outputs still equal the reference."""
    shape = {"tokens": 70, "n": 4100, "k": 256}
    spec = OPS[name]
    cfg = kernel.interpreter_config(70, 4100)
    assert (cfg.block_m, cfg.block_n, cfg.split_k) == (64, 4096, False)
    args = spec.make_inputs(shape, torch.float32, 3, "cpu", {"bias": True})
    tol = spec.tolerance(torch.float32, shape)
    torch.testing.assert_close(kernel.launch(*args), spec.reference(*args), atol=tol.atol, rtol=tol.rtol)


def _planted(tmp_path, op: str, label: str, *edits: tuple[str, str]):
    """The op's baseline with one bug: each edit replaces text that occurs exactly once."""
    source = baseline_source(op)
    for old, new in edits:
        assert source.count(old) == 1, old
        source = source.replace(old, new)
    path = tmp_path / f"{label}.py"
    path.write_text(source)
    return path


_UNSCALED = (("        acc *= tl.load(s_ptr + rn)[None, :]\n", ""),  # both paths: tiles and split-K reduction
             ("    acc *= tl.load(s_ptr + offs % N, mask=mask, other=0.0)\n", ""))
PLANTED = {
    "linear_int8": {"ignores_scales": _UNSCALED},
    "linear_int4": {"nibbles_swapped": (("shift = ((offs_k % 2) * 4)[:, None]",
                                         "shift = ((1 - offs_k % 2) * 4)[:, None]"),),
                    "group0_scale_everywhere": (("tl.load(s_ptr + rn * stride_sn + k0 // G)",
                                                 "tl.load(s_ptr + rn * stride_sn)"),)},
    "linear_fp8": {"ignores_scales": _UNSCALED},
}


@pytest.mark.parametrize("name", QUANT_OPS)
def test_the_judge_passes_each_baseline_and_refuses_its_planted_bugs(capsys, tmp_path, name):
    """`agent check` (the sandbox's battery, in bfloat16: every dtype runs in-process above) on the
    baseline and on the baseline with each planted bug, in one run."""
    (tmp_path / "baseline.py").write_text(baseline_source(name))
    wrong = [_planted(tmp_path, name, label, *edits) for label, edits in PLANTED[name].items()]
    code = main(["check", name, str(tmp_path / "baseline.py"), *map(str, wrong), "--device", "cpu", "--no-timing",
                 "--no-history", "--dtypes", "bfloat16", "--json"])
    out, _ = capsys.readouterr()
    verdicts = {v["file"].rsplit("/", 1)[-1]: v for v in map(json.loads, out.strip().splitlines())}
    assert code == 0 and len(verdicts) == 1 + len(wrong)
    assert verdicts.pop("baseline.py")["correct"]
    for file, v in verdicts.items():
        assert not v["correct"] and v["failure"] == "mismatch", (file, v["failure"], v["reason"])
