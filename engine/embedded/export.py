"""Writing the embedded model as a Hugging Face model directory (what `--model DIR` also reads)."""

from __future__ import annotations

import json
from pathlib import Path

from safetensors.torch import save_file
from tokenizers import Tokenizer

from .bpe import BOS, EOS, EOT, tokenizer_config
from .model import ModelConfig, Params


def hf_config(cfg: ModelConfig, bos_id: int, eos_ids: list[int]) -> dict:
    """config.json for LlamaForCausalLM: every field transformers (and the engine) reads."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_hidden_layers,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": cfg.max_position_embeddings,
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta,
        "rope_scaling": None,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "initializer_range": 0.02,
        "tie_word_embeddings": cfg.tie_word_embeddings,
        "bos_token_id": bos_id,
        "eos_token_id": eos_ids,
        "pad_token_id": None,
        "torch_dtype": "float32",
        "use_cache": True,
    }


def _write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def export(out_dir: Path, cfg: ModelConfig, params: Params, tok: Tokenizer) -> None:
    """Write config.json, generation_config.json, model.safetensors and the tokenizer files."""
    bos_id = tok.token_to_id(BOS)
    eos_ids = [tok.token_to_id(EOT), tok.token_to_id(EOS)]  # chat turns end with <|eot_id|>
    _write_json(out_dir / "config.json", hf_config(cfg, bos_id, eos_ids))
    _write_json(out_dir / "generation_config.json", {
        "bos_token_id": bos_id,
        "eos_token_id": eos_ids,
        "do_sample": False,
    })
    tensors = {name: t.detach().to("cpu").contiguous() for name, t in params.items()}
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    tok.save(str(out_dir / "tokenizer.json"))
    _write_json(out_dir / "tokenizer_config.json", tokenizer_config())
