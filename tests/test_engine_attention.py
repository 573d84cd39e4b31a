"""The engine's attention (engine/attention.py, engine/batch.py): the layouts ForwardBatch builds on
the host, extend through the extend_attention op against the definition (reading the pool the
engine wrote), and a forward that a CUDA graph can capture (no device value read on the host)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kernelloop.engine.attention import attention
from kernelloop.engine.batch import ForwardBatch
from kernelloop.engine.config import ModelConfig
from kernelloop.engine.memory import KVPool
from kernelloop.kernels.compare import check_outputs
from kernelloop.kernels.dispatch import Dispatcher
from kernelloop.kernels.ops import OPS

REPO = Path(__file__).resolve().parents[1]
PREFIXES, NEW = [0, 37, 5, 20], [18, 1, 9, 30]


def request_slots(seed: int = 11, num_slots: int = 160) -> list[torch.Tensor]:
    """Each request's slots (prefix, then new), scattered over the pool; slot 0 stays reserved."""
    free = torch.randperm(num_slots - 1, generator=torch.Generator().manual_seed(seed)) + 1
    ends = torch.tensor(PREFIXES) + torch.tensor(NEW)
    return list(torch.split(free[:int(ends.sum())], ends.tolist()))


def test_extend_batch_reads_only_the_cached_prefixes():
    slots = request_slots()
    batch = ForwardBatch.build("extend", [[3] * n for n in NEW], PREFIXES, slots, "cpu")
    assert batch.qo_indptr.tolist() == [0, 18, 19, 28, 58] and batch.qo_indptr.dtype == torch.int32
    assert batch.kv_indptr.tolist() == [0, 0, 37, 42, 62] and batch.kv_indptr.dtype == torch.int32
    assert batch.kv_indices.tolist() == torch.cat([s[:p] for s, p in zip(slots, PREFIXES)]).tolist()
    assert batch.out_slots.tolist() == torch.cat([s[p:] for s, p in zip(slots, PREFIXES)]).tolist()
    assert batch.positions.tolist() == [i for p, n in zip(PREFIXES, NEW) for i in range(p, p + n)]
    assert batch.last_token_index.tolist() == [17, 18, 27, 57]


def test_decode_batch_reads_every_token():
    slots = [s[:p + 1] for s, p in zip(request_slots(), PREFIXES)]
    batch = ForwardBatch.build("decode", [[3]] * 4, PREFIXES, slots, "cpu")
    assert batch.qo_indptr is None
    assert batch.kv_indptr.tolist() == [0, 1, 39, 45, 66]
    assert batch.kv_indices.tolist() == torch.cat(slots).tolist()
    assert batch.out_slots.tolist() == [s[-1].item() for s in slots]


def definition(q: torch.Tensor, pool: KVPool, slots: list[torch.Tensor], scale: float) -> torch.Tensor:
    """float64 causal attention of each request's new tokens over all its tokens, read from the pool."""
    hq, hk = q.shape[1], pool.k[0].shape[1]
    out, start = [], 0
    for s, p, n in zip(slots, PREFIXES, NEW):
        keys = pool.k[0][s].double().repeat_interleave(hq // hk, dim=1)  # [p + n, Hq, D]
        values = pool.v[0][s].double().repeat_interleave(hq // hk, dim=1)
        scores = torch.einsum("thd,lhd->htl", q[start:start + n].double(), keys) * scale
        visible = torch.arange(p + n)[None, :] <= p + torch.arange(n)[:, None]
        probs = torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1)
        out.append(torch.einsum("htl,lhd->thd", probs, values))
        start += n
    return torch.cat(out)


@pytest.mark.parametrize("kernels", ["reference", "baseline"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=lambda d: str(d)[6:])
def test_extend_through_the_op_matches_the_definition(kernels, dtype):
    g = torch.Generator().manual_seed(12)
    hq, hk, d, num_slots = 8, 2, 64, 160
    config = ModelConfig(vocab_size=8, hidden_size=hq * d, intermediate_size=8, num_layers=1, num_heads=hq,
                         num_kv_heads=hk, head_dim=d, rms_norm_eps=1e-5, max_position_embeddings=128,
                         tie_word_embeddings=True)
    pool = KVPool(config, num_slots, dtype, "cpu")
    pool.k[0].copy_(torch.randn(num_slots, hk, d, generator=g))  # the cached prefixes (and stale slots)
    pool.v[0].copy_(torch.randn(num_slots, hk, d, generator=g))
    slots = request_slots()
    batch = ForwardBatch.build("extend", [[3] * n for n in NEW], PREFIXES, slots, "cpu")
    t = batch.num_tokens
    q = torch.randn(t, hq, d, generator=g).to(dtype)
    kv = torch.randn(t, 2 * hk, d, generator=g).to(dtype)  # k and v as strided views, as the model's qkv
    kd = Dispatcher(kernels)

    out = attention(q, kv[:, :hk], kv[:, hk:], 0, batch, pool, kd, d ** -0.5)
    assert torch.equal(pool.k[0][batch.out_slots], kv[:, :hk]) and torch.equal(pool.v[0][batch.out_slots], kv[:, hk:])
    c = check_outputs(OPS["extend_attention"], out, definition(q, pool, slots, d ** -0.5).to(dtype), dtype)
    assert c.ok, c.reason
    assert set(kd.variants_in_use()["extend_attention"].values()) == {kernels}


_CAPTURE = r'''
import dataclasses, json, torch
from kernelloop.engine.batch import ForwardBatch
from kernelloop.engine.config import ModelConfig
from kernelloop.engine.memory import KVPool
from kernelloop.engine.models.decoder import DecoderModel
from kernelloop.kernels.dispatch import Dispatcher
from kernelloop.kernels.target_compile import capture_launches

llama = ModelConfig(vocab_size=1000, hidden_size=256, intermediate_size=512, num_layers=2, num_heads=8,
                    num_kv_heads=2, head_dim=32, rms_norm_eps=1e-5, max_position_embeddings=1024,
                    tie_word_embeddings=False)
# Qwen3 with attention_bias: every optional call site (q/k/v and o biases, per-head q/k norms)
qwen3 = dataclasses.replace(llama, qkv_bias=True, o_bias=True, qk_norm=True)
slots = [torch.arange(1 + 300 * i, 1 + 300 * i + n) for i, n in enumerate((40, 1, 257))]
batches = {"decode": ForwardBatch.build("decode", [[5]] * 3, [39, 0, 256], slots, "meta"),
           "extend": ForwardBatch.build("extend", [[5] * 7, [6], [7] * 30], [33, 0, 227], slots, "meta")}
out = {}
for name, config in (("llama", llama), ("qwen3", qwen3)):
    model = DecoderModel(config, torch.bfloat16, "meta")  # meta tensors: reading a value on the host raises
    pool = KVPool(config, 1024, torch.bfloat16, "meta")
    kd = Dispatcher("baseline")
    out[name] = {}
    for mode, batch in batches.items():
        with capture_launches() as launches:  # kernels recorded, not run
            logits = model.forward(batch, pool, kd)
        out[name][mode] = {"kernels": [l.name for l in launches], "logits": [str(logits.device), *logits.shape]}
    out[name]["variants"] = kd.variants_in_use()
print(json.dumps(out))
'''


def test_forward_never_reads_device_values_on_the_host(tmp_path):
    """What CUDA-graph capture of decode needs: with baseline kernels the whole forward runs on meta
    tensors, where any .item(), .tolist() or data-dependent shape raises (and dispatch would fall
    back to the reference, which the variants check catches)."""
    script = tmp_path / "capture_forward.py"
    script.write_text(_CAPTURE)
    env = {**os.environ, "TRITON_INTERPRET": "0", "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, str(script)], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    layers = 2
    for name, norms in (("llama", 1), ("qwen3", 1 + 2 * layers)):  # the first input norm; q and k norms per layer
        result = results[name]
        for mode, attention_kernel in (("decode", "_stage1_kernel"), ("extend", "_extend_kernel")):
            kernels = result[mode]["kernels"]
            assert result[mode]["logits"] == ["meta", 3, 1000], (name, mode)
            # qkv, o, gate_up, down; lm_head
            assert kernels.count("_linear_kernel") == 4 * layers + 1, (name, mode, kernels)
            assert kernels.count(attention_kernel) == layers, (name, mode, kernels)
            assert kernels.count("_rmsnorm_kernel") == norms, (name, mode, kernels)
        for op, variants in result["variants"].items():  # every op called (the quantized linears are not)
            assert set(variants.values()) <= {"baseline"}, (name, op, variants)
        assert {"linear", "extend_attention", "decode_attention", "rope", "silu_mul"} <= set(result["variants"])
