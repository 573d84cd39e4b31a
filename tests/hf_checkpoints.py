"""Small random checkpoints written by transformers itself (Llama, Qwen2, Qwen3, Mistral), across the
config variants the engine must support. Weights are re-drawn at a scale that makes next-token
distributions peaked, so greedy comparisons are not decided by float noise between near-equal logits."""

from __future__ import annotations

import json
from pathlib import Path

import torch

# Variant -> config fields; `family` (default llama) picks transformers' config and model classes.
VARIANTS: dict[str, dict] = {
    "gqa": dict(num_attention_heads=4, num_key_value_heads=2, head_dim=16),
    "mqa-untied": dict(num_attention_heads=4, num_key_value_heads=1, head_dim=16, tie_word_embeddings=False),
    "mha-explicit-head-dim": dict(num_attention_heads=2, num_key_value_heads=2, head_dim=24),
    "llama3-rope": dict(num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=16384,
                        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                         "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                         "original_max_position_embeddings": 8192}),
    # q/k/v biases; head_dim = hidden / heads = 12
    "qwen2": dict(family="qwen2", num_attention_heads=4, num_key_value_heads=2, rope_theta=1000000.0),
    # per-head q/k norms, head_dim wider than hidden / heads
    "qwen3": dict(family="qwen3", num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=False),
    "qwen3-bias": dict(family="qwen3", num_attention_heads=4, num_key_value_heads=1, head_dim=16, attention_bias=True),
    # a sliding window longer than the 1024 positions: transformers masks with it, and hides nothing
    "mistral": dict(family="mistral", num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=4096),
}
FAMILIES = {"llama": ("LlamaConfig", "LlamaForCausalLM"), "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
            "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"), "mistral": ("MistralConfig", "MistralForCausalLM")}


def family_of(variant: str) -> str:
    return VARIANTS[variant].get("family", "llama")


def make_checkpoint(path: Path, variant: str = "gqa", seed: int = 0, shard: bool = False,
                    embed_std: float = 1.0) -> Path:
    """A tiny random model in HF format at `path`. `embed_std` scales the (tied) embeddings: small values
    give small logits, so sampled text spreads over the vocabulary instead of looping."""
    import transformers

    kwargs = dict(vocab_size=211, hidden_size=48, intermediate_size=112, num_hidden_layers=2,
                  rms_norm_eps=1e-5, max_position_embeddings=1024, tie_word_embeddings=True,
                  bos_token_id=1, eos_token_id=2)
    kwargs.update({k: v for k, v in VARIANTS[variant].items() if k != "family"})
    config_class, model_class = (getattr(transformers, name) for name in FAMILIES[family_of(variant)])
    torch.manual_seed(seed)
    model = model_class(config_class(**kwargs)).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            elif name.endswith(".bias"):
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
            elif "embed_tokens" in name or name == "lm_head.weight":
                p.copy_(torch.randn(p.shape, generator=g) * embed_std)
            else:
                p.copy_(torch.randn(p.shape, generator=g) * (1.5 / p.shape[1] ** 0.5))
    model.save_pretrained(path, max_shard_size="40KB" if shard else "2GB")
    write_word_tokenizer(path, kwargs["vocab_size"])
    return path


def write_word_tokenizer(path: Path, vocab_size: int) -> None:
    """A word-level tokenizer over `w0 .. w{V-1}`: text prompts map 1:1 onto token ids."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {f"w{i}": i for i in range(vocab_size)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(Path(path) / "tokenizer.json"))
    template = "{% for m in messages %}{{ m['role'] }} {{ m['content'] }} {% endfor %}{% if add_generation_prompt %}w3{% endif %}"
    (Path(path) / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
