"""What every GPU step shares for `--rehearse`: the same Python path on CPU, interpreted, at tiny shapes.

A GPU is lent for minutes and `bench/gpu_check.sh` gets one try, so each GPU step takes `--rehearse`:
the step runs exactly its GPU code path on the CPU device (Triton's interpreter) and the shapes
below, so a step that would crash on the GPU crashes in CI first. Rehearsal numbers time the
interpreter and say nothing about a GPU; their reports are labelled `cpu-interpreter`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from kernelloop.kernels.device import CPU, CUDA, Device, triton_interpreted

# A Llama-architecture model small enough for the interpreter, shaped like the real ones: GQA
# (4 query heads over 2 KV heads), head_dim 32, untied embeddings, a byte-level vocabulary.
TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 384, "hidden_size": 64,
    "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 32, "rms_norm_eps": 1e-5, "max_position_embeddings": 1024, "tie_word_embeddings": False,
    "rope_theta": 10000.0, "torch_dtype": "bfloat16", "bos_token_id": 300, "eos_token_id": 301,
}

# Joins the messages of a chat; the random-weight models have no template of their own.
CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }} {% endfor %}"


def step_device(rehearse: bool, step: str) -> Device | None:
    """CUDA for a real run, CPU for a rehearsal; None (after one line on stderr) when neither can run."""
    if rehearse:
        if not triton_interpreted():
            print(f"{step}: --rehearse runs kernels in Triton's interpreter: set TRITON_INTERPRET=1", file=sys.stderr)
            return None
        return CPU
    if not torch.cuda.is_available():
        print(f"{step}: no CUDA device (use --rehearse to run this step's path on CPU)", file=sys.stderr)
        return None
    return CUDA


def write_chat_model_dir(path: Path, config: dict) -> Path:
    """A random-weight model folder (config and byte-level tokenizer) with the chat template above."""
    from bench.engine_gpu import write_model_dir

    model_dir = write_model_dir(path, config)
    (model_dir / "tokenizer_config.json").write_text(json.dumps({"chat_template": CHAT_TEMPLATE}))
    return model_dir
