"""decode_attention(q, k_buffer, v_buffer, kv_indptr, kv_indices, sm_scale) -> o: the baseline kernel
(kernels/ops/decode_attention_kernel.py, two-stage split-KV flash-decoding) with its constants as
parameters ("split"), and with one split, so that one kernel writes o in one pass ("onepass").

q, o [B, Hq, D]; K/V pools [slots, Hk, D]; request b's slots kv_indices[kv_indptr[b]:kv_indptr[b+1]];
Hq = G * Hk, query head h uses kv head h // G; float32 online softmax; an empty request gets o = 0.
The split count is decided on the host from the average context (kv_indices.numel() / B), no sync:
max(1, min(MAX_SPLITS, cdiv(avg, MIN_SPLIT_TOKENS), cdiv(TARGET_PROGRAMS, programs per split))).
"""

from __future__ import annotations

from typing import Any

from kernelloop.kernels.ops.decode_attention_kernel import head_blocks, num_kv_splits

from . import check_params, from_baseline, gpu_choices, pick

OP = "decode_attention"

DOMAINS: dict[str, dict[str, list[Any]]] = {
    "split": {"block_n": [16, 32, 64], "min_split_tokens": [64, 128, 256], "max_splits": [8, 16, 32],
              "num_warps": [4, 8], "num_stages": [1, 2]},
    "onepass": {"block_n": [16, 32, 64], "num_warps": [4, 8], "num_stages": [1, 2]},
}


def splits_for(params: dict[str, Any], shape: dict[str, int]) -> int:
    """The split count a config launches for `shape` (its forward's own formula)."""
    if params["template"] != "split":
        return 1
    B, Hq, Hk = int(shape["batch"]), int(shape["q_heads"]), int(shape["kv_heads"])
    programs = B * Hk * head_blocks(Hq, max(Hk, 1))[1]
    return num_kv_splits(B, programs, B * int(shape["kv_len"]), params["max_splits"], params["min_split_tokens"])


def space(ctx: Any) -> list[dict[str, Any]]:
    full = gpu_choices(ctx)
    shapes = [s for s in ctx.shapes if {"batch", "q_heads", "kv_heads", "kv_len"} <= set(s)]
    out: list[dict[str, Any]] = []
    seen: set[tuple] = set()
    for bn in (32, 16, 64):
        for mst in (128, 64, 256):
            for ms in (16, 8, 32):
                for w in pick([4, 8], full, 4):
                    for st in pick([2, 1], full, 2):
                        p = {"template": "split", "block_n": bn, "min_split_tokens": mst, "max_splits": ms,
                             "num_warps": w, "num_stages": st}
                        if shapes:  # configs that launch the same splits on every profiled shape are one
                            key = (bn, w, st, tuple(splits_for(p, s) for s in shapes))
                            if key in seen:
                                continue
                            seen.add(key)
                        out.append(p)
    for bn in (32, 64, 16):  # 128 would need > 228 KB of shared memory for float32 K/V tiles
        for w in pick([4, 8], full, 4):
            for st in pick([2, 1], full, 2):
                out.append({"template": "onepass", "block_n": bn, "num_warps": w, "num_stages": st})
    return out


def render(params: dict[str, Any]) -> str:
    check_params(OP, params, DOMAINS)
    constants = {"BLOCK_N": int(params["block_n"]), "NUM_WARPS": int(params["num_warps"]),
                 "NUM_STAGES": int(params["num_stages"]), "MAX_SPLITS": 1}
    if params["template"] == "split":
        constants.update(MAX_SPLITS=int(params["max_splits"]), MIN_SPLIT_TOKENS=int(params["min_split_tokens"]))
    return from_baseline(OP, params, constants)
