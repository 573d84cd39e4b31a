"""config.json -> ModelConfig through each family's mapping (engine/models/), and the one-line refusals of
configs the engine's decoder would compute wrongly."""

from __future__ import annotations

import json

import pytest

from kernelloop.engine.errors import ModelLoadError
from kernelloop.engine.models import ARCHITECTURES, model_config, read_config

BASE = {"architectures": ["LlamaForCausalLM"], "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64,
        "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2}
SUPPORTED = "(supported: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM)"


def refusal(config: dict) -> str:
    with pytest.raises(ModelLoadError) as info:
        model_config(config, "m/config.json")
    message = str(info.value)
    assert message.startswith("m/config.json: ") and "\n" not in message
    return message


@pytest.mark.parametrize("extra,needle", [
    ({"model_type": "mistral"}, "model_type 'mistral' is not supported for LlamaForCausalLM (only llama)"),
    ({"model_type": "qwen2"}, "model_type 'qwen2' is not supported"),
    ({"hidden_act": "gelu"}, "hidden_act 'gelu' is not supported"),
    ({"model_type": "llama", "hidden_act": "gelu_pytorch_tanh"}, "hidden_act 'gelu_pytorch_tanh' is not supported"),
    ({"mlp_bias": True}, "MLP biases (mlp_bias) are not supported"),
    ({"rope_parameters": {"rope_type": "yarn", "factor": 4.0}}, "rope type 'yarn' is not supported"),
    ({"num_key_value_heads": 3}, "4 heads are not a multiple of 3 kv heads"),
    ({"hidden_size": "wide"}, "missing or malformed field"),
])
def test_unsupported_model_type_or_activation_is_refused_in_one_line(extra, needle):
    assert needle in refusal({**BASE, **extra})


@pytest.mark.parametrize("config", [
    {**BASE, "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"},
    {**BASE, "architectures": "GPT2LMHeadModel"},
])
def test_an_unsupported_architecture_is_one_line_naming_the_supported_ones(config):
    assert refusal(config) == f"m/config.json: architecture GPT2LMHeadModel is not supported {SUPPORTED}"


def test_the_supported_architectures_are_discovered():
    assert list(ARCHITECTURES) == ["LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"]


@pytest.mark.parametrize("extra", [{}, {"model_type": "llama"}, {"hidden_act": "silu"},
                                   {"model_type": "llama", "hidden_act": "silu"}])
def test_llama_with_silu_or_fields_missing_is_accepted(extra):
    config = model_config({**BASE, **extra})
    assert config.num_layers == 1 and config.num_kv_heads == 2 and config.architecture == "LlamaForCausalLM"
    assert not (config.qkv_bias or config.o_bias or config.qk_norm)


def test_without_architectures_the_model_type_decides():
    no_arch = {k: v for k, v in BASE.items() if k != "architectures"}
    assert model_config(no_arch).architecture == "LlamaForCausalLM"
    assert model_config({**no_arch, "model_type": "qwen2"}).architecture == "Qwen2ForCausalLM"
    assert "model_type 'gemma' is not supported (supported: llama, mistral, qwen2, qwen3)" in refusal(
        {**no_arch, "model_type": "gemma"})


def test_each_family_maps_its_own_fields_and_transformers_defaults():
    llama = model_config({**BASE, "attention_bias": True})
    assert llama.qkv_bias and llama.o_bias and not llama.qk_norm
    qwen2 = model_config({**BASE, "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2"})
    assert (qwen2.qkv_bias, qwen2.o_bias, qwen2.qk_norm) == (True, False, False)
    assert qwen2.head_dim == 8 and qwen2.max_position_embeddings == 32768 and not qwen2.tie_word_embeddings
    qwen3 = model_config({**BASE, "architectures": ["Qwen3ForCausalLM"]})
    assert (qwen3.qkv_bias, qwen3.o_bias, qwen3.qk_norm) == (False, False, True)
    assert qwen3.head_dim == 128, "Qwen3's head_dim defaults to 128, not hidden_size / heads"
    qwen3_bias = model_config({**BASE, "architectures": ["Qwen3ForCausalLM"], "attention_bias": True, "head_dim": 8})
    assert (qwen3_bias.qkv_bias, qwen3_bias.o_bias, qwen3_bias.head_dim) == (True, True, 8)
    mistral = model_config({**BASE, "architectures": ["MistralForCausalLM"], "sliding_window": None})
    assert mistral.head_dim == 8 and mistral.max_position_embeddings == 131072 and mistral.rope.theta == 10000.0
    assert not (mistral.qkv_bias or mistral.o_bias or mistral.qk_norm)


MISTRAL = {**BASE, "architectures": ["MistralForCausalLM"], "model_type": "mistral", "max_position_embeddings": 32768}
QWEN2 = {**BASE, "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "max_position_embeddings": 32768}


@pytest.mark.parametrize("config", [
    {**MISTRAL, "sliding_window": 4096},
    MISTRAL,  # transformers' default window: 4096
    {**QWEN2, "use_sliding_window": True, "sliding_window": 4096, "max_window_layers": 0},
    {**QWEN2, "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "use_sliding_window": True,
     "sliding_window": 4096, "layer_types": ["sliding_attention"]},
])
def test_a_sliding_window_shorter_than_the_positions_is_refused(config):
    assert "sliding_window 4096 is shorter than max_position_embeddings 32768, and the engine has no " \
           "sliding-window attention" in refusal(config)


@pytest.mark.parametrize("config", [
    {**MISTRAL, "sliding_window": None},
    {**MISTRAL, "sliding_window": 32768},
    {**MISTRAL, "max_position_embeddings": 4096},  # the default window covers every position
    {**QWEN2, "use_sliding_window": False, "sliding_window": 4096},
    {**QWEN2, "use_sliding_window": True, "sliding_window": 4096, "max_window_layers": 28},  # no layer windowed
    {**QWEN2, "use_sliding_window": True, "sliding_window": 131072},
])
def test_a_sliding_window_that_hides_nothing_is_accepted(config):
    assert model_config(config).architecture in ("MistralForCausalLM", "Qwen2ForCausalLM")


def test_from_dir_names_the_file(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({**BASE, "model_type": "gemma"}))
    with pytest.raises(ModelLoadError,
                       match=r"config\.json: model_type 'gemma' is not supported for LlamaForCausalLM \(only llama\)"):
        read_config(tmp_path)
    with pytest.raises(ModelLoadError, match="is not a model directory"):
        read_config(tmp_path / "absent")
