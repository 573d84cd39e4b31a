"""bench.quantize_selection and bench.quantize_decode run end to end on the embedded model (cheap: one prompt,
a few tokens; the decode step's rehearsal is what gpu_check.sh --rehearse runs)."""

from __future__ import annotations

import json

import bench.quantize_decode as quantize_decode
import bench.quantize_selection as quantize_selection


def test_quantize_selection_writes_the_table_the_selection_and_the_chart(tmp_path, capsys):
    rc = quantize_selection.main(["--model", "", "--calibration", "1", "--validation", "1", "--held-out", "1",
                                  "--tokens", "3", "--seeds", "2", "--out-dir", str(tmp_path)])
    assert rc == 0
    [md] = tmp_path.glob("*-cpu-interpreter-quantize-selection.md")
    text = md.read_text()
    for row in ("kl-guided", "all int8", "all int4", "first/last kept int8", "random (seed 1)",
                "random, 2 seeds (mean [min, max])"):
        assert f"| {row} |" in text
    assert "Budget: **" in text and "the budget on held-out prompts" in text and "s per pass" in text
    assert "validation 1 prompts" in text and "validation KL" in text
    saved = json.loads(md.with_suffix(".json").read_text())
    assert saved["plan"] and set(saved["plan"].values()) <= {"int8", "int4"}
    narrower = set(saved["plan"].values()) != {"int8", "int4"}  # then 2 more random rows: its schemes only
    assert saved["budget"] > 0 and len(saved["held_out"]) == 1 + 2 + 2 + 2 + 2 * narrower
    assert ("| random, its schemes, 2 seeds (mean [min, max]) |" in text) == narrower
    assert md.with_suffix(".png").read_bytes()[:4] == b"\x89PNG" and f"]({md.stem}.png)" in text


def test_quantize_decode_rehearsal_serves_the_selection_from_registry_scoped_entries(tmp_path):
    assert quantize_decode.main(["--rehearse", "--out-dir", str(tmp_path)]) == 0
    [md] = tmp_path.glob("*-quantize-decode.md")
    text = md.read_text()
    assert "| unquantized |" in text and "selection: 2 projections (1 int4, 1 int8)" in text
    assert "served by: their registry kernels (every one)" in text


def test_quantize_decode_flags_a_projection_not_served_by_its_registry_kernel():
    plan = {"layers.0.down_proj": "int8", "layers.1.qkv_proj": "int4"}
    good = {"linear_int8@layers.0.down_proj": {"float32 *": "registry:linear_int8-1"},
            "linear_int4@layers.1.qkv_proj": {"float32 *": "registry:linear_int4-2"}}
    assert quantize_decode.served_by_registry(good, plan) == []
    fell_back = {**good, "linear_int4@layers.1.qkv_proj": {"float32 *": "baseline"}}
    assert quantize_decode.served_by_registry(fell_back, plan) == ["linear_int4@layers.1.qkv_proj: baseline"]
    assert quantize_decode.served_by_registry({}, {"lm_head": "int8"}) == ["linear_int8@lm_head: never called"]
