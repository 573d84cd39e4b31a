"""Engine decode throughput on a GPU: `python -m bench.engine_gpu [--batches 1,32] [--out-dir DIR]`.

A Llama-3-8B-shaped model with seeded random weights in bfloat16 (no checkpoint download), decode
tokens/s at each batch size, against (a) the bound of weight bytes over a copy bandwidth measured
in the same run (every decode step reads every weight once) and (b) transformers' `generate()`
on a random model of the same shape. Prompts are 128 tokens, 128 tokens are generated, EOS ignored.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

import torch

import kernels  # noqa: F401  (configures Triton)
from bench.report import print_table, write_report
from engine.engine import Engine, EngineConfig
from engine.sampling import SamplingParams
from engine.scheduler import SchedulerConfig
from kernels.timing import measure_copy_bandwidth

LLAMA3_8B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128256, "hidden_size": 4096,
    "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
    "head_dim": 128, "rms_norm_eps": 1e-5, "max_position_embeddings": 8192, "tie_word_embeddings": False,
    "rope_theta": 500000.0, "torch_dtype": "bfloat16", "bos_token_id": 128000, "eos_token_id": 128001,
}


def write_model_dir(path: Path, config: dict) -> Path:
    """config.json plus a byte-level tokenizer; the weights come from EngineConfig(random_weights=True).

    Every byte of any text is a token of its own (ids 0-255; the rest of the vocabulary is filler), so
    the profile's and the gate's prompts are distinct token sequences: with a word-level vocabulary of
    made-up words every real prompt was unknown words, all token 0, and the prefix cache made them one."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    (path / "config.json").write_text(json.dumps(config))
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {c: i for i, c in enumerate(alphabet)}
    vocab.update({f"<filler{i}>": i for i in range(len(vocab), config["vocab_size"])})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.save(str(path / "tokenizer.json"))
    return path


def engine_decode(engine: Engine, batch: int, prompt_len: int, new_tokens: int) -> dict:
    g = torch.Generator().manual_seed(batch)
    params = SamplingParams(max_tokens=new_tokens, temperature=0, ignore_eos=True)
    reqs = [engine.add_request(torch.randint(10, 100000, (prompt_len,), generator=g).tolist(), params)
            for _ in range(batch)]
    start = time.perf_counter()
    while any(not r.output_ids for r in reqs):  # prefill
        engine.step()
    torch.cuda.synchronize()
    decode_start = time.perf_counter()
    before = sum(len(r.output_ids) for r in reqs)
    while engine.has_work():
        engine.step()
    torch.cuda.synchronize()
    end = time.perf_counter()
    decoded = sum(len(r.output_ids) for r in reqs) - before
    for r in reqs:
        engine.requests.pop(r.rid, None)
    return {"total_s": end - start, "decode_s": end - decode_start, "decode_tokens": decoded,
            "total_tokens": batch * new_tokens}


def hf_generate(model, batch: int, prompt_len: int, new_tokens: int) -> float:
    g = torch.Generator().manual_seed(batch)
    ids = torch.randint(10, 100000, (batch, prompt_len), generator=g).cuda()
    kwargs = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
    model.generate(ids[:, :8], max_new_tokens=2, do_sample=False, pad_token_id=0)  # warm-up
    torch.cuda.synchronize()
    start = time.perf_counter()
    with torch.no_grad():
        model.generate(ids, attention_mask=torch.ones_like(ids), **kwargs)
    torch.cuda.synchronize()
    return time.perf_counter() - start


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.engine_gpu", description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="1,32")
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--kernels", default="baseline", choices=("reference", "baseline", "registry"))
    parser.add_argument("--no-hf", action="store_true", help="skip the transformers comparison")
    parser.add_argument("--out-dir", default=None)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench.engine_gpu: no CUDA device", file=sys.stderr)
        return 2
    batches = [int(b) for b in args.batches.split(",")]
    copy_bw = measure_copy_bandwidth("cuda")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = write_model_dir(Path(tmp), LLAMA3_8B)
        sched = SchedulerConfig(max_running_requests=max(batches), max_prefill_tokens=8192)
        engine = Engine(EngineConfig(model=str(model_dir), device="cuda", dtype="bfloat16", kernels=args.kernels,
                                     random_weights=True, kv_cache_bytes=16 << 30, scheduler=sched))
        weight_bytes = sum(t.numel() * t.element_size() for t in engine.model.parameters().values())
        engine_decode(engine, 1, 16, 4)  # warm-up
        for b in batches:
            print(f"engine, batch {b} ...", file=sys.stderr, flush=True)
            r = engine_decode(engine, b, args.prompt_len, args.new_tokens)
            bound = b * copy_bw / weight_bytes
            decode_tps = r["decode_tokens"] / r["decode_s"]
            rows.append({"system": f"kernelloop ({args.kernels} kernels, cuda graphs {'on' if engine.graphs else 'off'})",
                         "batch": b, "decode tok/s": round(decode_tps, 1), "end-to-end tok/s": round(r["total_tokens"] / r["total_s"], 1),
                         "bound tok/s": round(bound, 1), "% of bound": round(100 * decode_tps / bound, 1)})
        # A Triton kernel that raises falls back to the reference: say what actually served each op.
        variants = {op: sorted(set(v.values())) for op, v in engine.kernels.variants_in_use().items()}
        del engine
        torch.cuda.empty_cache()
    hf_missing = None
    if not args.no_hf:
        try:  # the comparison is optional: a machine without transformers keeps the rows measured above
            from transformers import LlamaConfig, LlamaForCausalLM
        except ImportError as exc:
            hf_missing = f"transformers not importable ({exc}); its rows are missing"
            print(f"bench.engine_gpu: {hf_missing}", file=sys.stderr)
    if not args.no_hf and hf_missing is None:
        with torch.device("cuda"):
            hf = LlamaForCausalLM(LlamaConfig(**LLAMA3_8B)).to(torch.bfloat16).eval()
        for b in batches:
            print(f"transformers, batch {b} ...", file=sys.stderr, flush=True)
            seconds = hf_generate(hf, b, args.prompt_len, args.new_tokens)
            rows.append({"system": "transformers generate", "batch": b, "decode tok/s": None,
                         "end-to-end tok/s": round(b * args.new_tokens / seconds, 1),
                         "bound tok/s": round(b * copy_bw / weight_bytes, 1), "% of bound": None})
    print_table(rows)
    notes = [f"copy bandwidth {copy_bw / 1e9:.0f} GB/s (read + write) measured at the start of this run; "
             f"weights {weight_bytes / 1e9:.2f} GB; bound = batch x bandwidth / weight bytes (KV reads ignored).",
             f"prompts {args.prompt_len} tokens, {args.new_tokens} new tokens per request, greedy, EOS ignored; "
             "decode tok/s counts only steps after every request's prefill; end-to-end includes prefill.",
             "variants that served each op: " + "; ".join(f"{op}: {', '.join(v)}" for op, v in sorted(variants.items()))]
    print(notes[-1])
    notes += [hf_missing] if hf_missing else []
    path = write_report("engine-decode", "Engine decode throughput, Llama-3-8B shape, bfloat16", rows, device="cuda",
                        notes=notes, out_dir=args.out_dir)
    print(f"wrote {path}")
    if args.kernels != "reference" and any("reference" in v for v in variants.values()):
        print("bench.engine_gpu: a Triton kernel failed and its op fell back to the reference", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
