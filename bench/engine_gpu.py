"""Engine decode throughput on a GPU: `python -m bench.engine_gpu [--batches 1,32] [--out-dir DIR] [--rehearse]`.

A Llama-3-8B-shaped model with seeded random weights in bfloat16 (no checkpoint download), decode
tokens/s at each batch size, against (a) the bound of the weight bytes one decode step reads over a
copy bandwidth measured in the same run (`decode_step_bytes`: every weight once, but only the B
looked-up rows of the embedding table) and (b) transformers' `generate()` on a random model of the
same shape. Prompts are 128 tokens, 128 tokens are generated, EOS ignored. The report is rewritten
after every measured row (marked PARTIAL until the end), so a run cut by its timeout keeps its rows.
Exit 1 when a Triton kernel fell back to its reference.

`--rehearse` runs the same path on CPU (Triton's interpreter) with bench/rehearse.py's tiny model,
batches 1,2, 8-token prompts and 4 new tokens; its numbers time the interpreter, nothing else.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch

import kernelloop.kernels.ops  # noqa: F401  (configures Triton)
from kernelloop.engine.engine import Engine, EngineConfig
from kernelloop.engine.sampling import SamplingParams
from kernelloop.engine.scheduler import SchedulerConfig
from kernelloop.kernels.device import Device
from kernelloop.kernels.timing import measure_copy_bandwidth

from bench.rehearse import TINY_LLAMA, step_device
from bench.report import print_table, write_report

LLAMA3_8B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128256, "hidden_size": 4096,
    "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
    "head_dim": 128, "rms_norm_eps": 1e-5, "max_position_embeddings": 8192, "tie_word_embeddings": False,
    "rope_theta": 500000.0, "torch_dtype": "bfloat16", "bos_token_id": 128000, "eos_token_id": 128001,
}

# (batches, prompt tokens, new tokens, KV-cache bytes): the GPU run and its CPU rehearsal
GPU_RUN = ("1,32", 128, 128, 16 << 30)
REHEARSAL = ("1,2", 8, 4, 64 << 20)
STEP = "bench.engine_gpu"


def write_model_dir(path: Path, config: dict) -> Path:
    """config.json plus a byte-level tokenizer; the weights come from EngineConfig(random_weights=True).

    Every byte of any text is a token of its own (ids 0-255; the rest of the vocabulary is filler), so
    the profile's and the gate's prompts are distinct token sequences (a word-level vocabulary of made-up
    words would make every real prompt unknown words, all token 0, and the prefix cache would merge them)."""
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


def decode_step_bytes(param_bytes: Mapping[str, int], batch: int, vocab_size: int, tied: bool) -> int:
    """Weight bytes one decode step of `batch` requests reads (KV reads aside).

    `param_bytes`: engine-layout name -> bytes (`Model.parameters()`; a tied lm_head appears only as
    embed_tokens). Every weight is read once, except the embedding table: the lookup reads only the
    B rows of the step's tokens (at most B distinct, at most the vocabulary). Untied, the lm_head is
    read whole on top; tied, the lm_head reads the whole table, so it counts once, in full."""
    if batch < 1:
        raise ValueError(f"decode_step_bytes: batch must be >= 1, got {batch}")
    embed = param_bytes["embed_tokens"]
    rest = sum(n for name, n in param_bytes.items() if name != "embed_tokens")
    if tied:
        return rest + embed
    return rest + embed * min(batch, vocab_size) // vocab_size


def engine_decode(engine: Engine, batch: int, prompt_len: int, new_tokens: int) -> dict:
    g = torch.Generator().manual_seed(batch)
    vocab = engine.model_config.vocab_size
    params = SamplingParams(max_tokens=new_tokens, temperature=0, ignore_eos=True)
    reqs = [engine.add_request(torch.randint(10, min(100000, vocab), (prompt_len,), generator=g).tolist(), params)
            for _ in range(batch)]
    start = time.perf_counter()
    while any(not r.output_ids for r in reqs):  # prefill
        engine.step()
    engine.config.device.synchronize()
    decode_start = time.perf_counter()
    before = sum(len(r.output_ids) for r in reqs)
    while engine.has_work():
        engine.step()
    engine.config.device.synchronize()
    end = time.perf_counter()
    decoded = sum(len(r.output_ids) for r in reqs) - before
    for r in reqs:
        engine.requests.pop(r.rid, None)
    return {"total_s": end - start, "decode_s": end - decode_start, "decode_tokens": decoded,
            "total_tokens": batch * new_tokens}


def hf_generate(model, batch: int, prompt_len: int, new_tokens: int, device: Device) -> float:
    g = torch.Generator().manual_seed(batch)
    ids = torch.randint(10, min(100000, model.config.vocab_size), (batch, prompt_len), generator=g).to(device.torch)
    kwargs = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        model.generate(ids[:, :8], max_new_tokens=2, do_sample=False, pad_token_id=0)  # warm-up
    device.synchronize()
    start = time.perf_counter()
    with torch.no_grad():
        model.generate(ids, attention_mask=torch.ones_like(ids), **kwargs)
    device.synchronize()
    return time.perf_counter() - start


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.engine_gpu", description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default=None, help=f"comma-separated (default {GPU_RUN[0]}; rehearsal {REHEARSAL[0]})")
    parser.add_argument("--prompt-len", type=int, default=None, help=f"default {GPU_RUN[1]} (rehearsal {REHEARSAL[1]})")
    parser.add_argument("--new-tokens", type=int, default=None, help=f"default {GPU_RUN[2]} (rehearsal {REHEARSAL[2]})")
    parser.add_argument("--kernels", default="baseline", choices=("reference", "baseline", "registry"))
    parser.add_argument("--no-hf", action="store_true", help="skip the transformers comparison")
    parser.add_argument("--rehearse", action="store_true",
                        help="this step's path on CPU (TRITON_INTERPRET=1) with a tiny model and tiny batches")
    parser.add_argument("--out-dir", default=None)
    args = parser.parse_args(argv)
    plan = REHEARSAL if args.rehearse else GPU_RUN
    args.batches = args.batches or plan[0]
    args.prompt_len = args.prompt_len or plan[1]
    args.new_tokens = args.new_tokens or plan[2]
    args.kv_cache_bytes = plan[3]
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    device = step_device(args.rehearse, STEP)
    if device is None:
        return 2
    config = TINY_LLAMA if args.rehearse else LLAMA3_8B
    shape_name = "tiny Llama (rehearsal)" if args.rehearse else "Llama-3-8B shape"
    batches = [int(b) for b in args.batches.split(",")]
    copy_bw = measure_copy_bandwidth(device)
    rows: list[dict[str, Any]] = []
    state: dict[str, Any] = {"variants": None, "weight_bytes": None, "step_bytes": {}, "hf_missing": None}

    def write(status: str) -> Path:
        """The report as it stands; `status` ("PARTIAL: ...") leads the notes until the run ends."""
        step_bytes = ", ".join(f"batch {b}: {n / 1e9:.4g} GB" for b, n in state["step_bytes"].items())
        notes = [status] if status else []
        notes += [
            f"{shape_name}, random bf16 weights on {device}, kernels={args.kernels}.",
            f"copy bandwidth {copy_bw / 1e9:.1f} GB/s (read + write) measured at the start of this run; weights "
            f"{(state['weight_bytes'] or 0) / 1e9:.4g} GB; bytes read per decode step (every weight once, only the "
            f"batch's rows of embed_tokens): {step_bytes or 'n/a'}; bound = batch x bandwidth / bytes per step "
            "(KV reads ignored).",
            f"prompts {args.prompt_len} tokens, {args.new_tokens} new tokens per request, greedy, EOS ignored; "
            "decode tok/s counts only steps after every request's prefill; end-to-end includes prefill.",
        ]
        if state["variants"] is not None:
            notes.append("variants that served each op: "
                         + "; ".join(f"{op}: {', '.join(v)}" for op, v in sorted(state["variants"].items())))
        notes += [state["hf_missing"]] if state["hf_missing"] else []
        return write_report("engine-decode", f"Engine decode throughput, {shape_name}, bfloat16", rows, device=device.torch,
                            notes=notes, out_dir=args.out_dir)

    def bound(b: int) -> float:
        return b * copy_bw / state["step_bytes"][b]

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = write_model_dir(Path(tmp), config)
        sched = SchedulerConfig(max_running_requests=max(batches), max_prefill_tokens=8192)
        engine = Engine(EngineConfig(model=str(model_dir), device=device, dtype="bfloat16", kernels=args.kernels,
                                     random_weights=True, kv_cache_bytes=args.kv_cache_bytes, scheduler=sched))
        param_bytes = {name: t.numel() * t.element_size() for name, t in engine.model.parameters().items()}
        state["weight_bytes"] = sum(param_bytes.values())
        for b in batches:
            state["step_bytes"][b] = decode_step_bytes(param_bytes, b, engine.model_config.vocab_size,
                                                       engine.model_config.tie_word_embeddings)
        graphs = "on" if engine.graphs else "off"
        engine_decode(engine, 1, min(16, args.prompt_len), 4)  # warm-up
        for b in batches:
            print(f"engine, batch {b} ...", file=sys.stderr, flush=True)
            r = engine_decode(engine, b, args.prompt_len, args.new_tokens)
            decode_tps = r["decode_tokens"] / r["decode_s"]
            rows.append({"system": f"kernelloop ({args.kernels} kernels, cuda graphs {graphs})",
                         "batch": b, "decode tok/s": round(decode_tps, 1),
                         "end-to-end tok/s": round(r["total_tokens"] / r["total_s"], 1),
                         "bound tok/s": round(bound(b), 1), "% of bound": round(100 * decode_tps / bound(b), 1)})
            # A Triton kernel that raises falls back to the reference: say what actually served each op.
            state["variants"] = {op: sorted(set(v.values())) for op, v in engine.kernels.variants_in_use().items()}
            write(f"PARTIAL: stopped after the engine at batch {b}")
        del engine
        gc.collect()
        if not device.interpreted:
            torch.cuda.empty_cache()
    if not args.no_hf:
        try:  # the comparison is optional: a machine without transformers keeps the rows measured above
            from transformers import LlamaConfig, LlamaForCausalLM
        except ImportError as exc:
            state["hf_missing"] = f"transformers not importable ({exc}); its rows are missing"
            print(f"{STEP}: {state['hf_missing']}", file=sys.stderr)
    if not args.no_hf and state["hf_missing"] is None:
        with device.torch:
            hf = LlamaForCausalLM(LlamaConfig(**config)).to(torch.bfloat16).eval()
        for b in batches:
            print(f"transformers, batch {b} ...", file=sys.stderr, flush=True)
            seconds = hf_generate(hf, b, args.prompt_len, args.new_tokens, device)
            rows.append({"system": "transformers generate", "batch": b, "decode tok/s": None,
                         "end-to-end tok/s": round(b * args.new_tokens / seconds, 1),
                         "bound tok/s": round(bound(b), 1), "% of bound": None})
            write(f"PARTIAL: stopped after transformers at batch {b}")
        del hf
    print_table(rows)
    variants = state["variants"] or {}
    print("variants that served each op: " + "; ".join(f"{op}: {', '.join(v)}" for op, v in sorted(variants.items())))
    path = write("")
    print(f"wrote {path}")
    if args.kernels != "reference" and any("reference" in v for v in variants.values()):
        print(f"{STEP}: a Triton kernel failed and its op fell back to the reference", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
