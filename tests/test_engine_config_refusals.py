"""ModelConfig refuses, in one line, configs the engine's Llama forward would compute wrongly."""

from __future__ import annotations

import json

import pytest

from kernelloop.engine.config import ModelConfig
from kernelloop.engine.errors import ModelLoadError

BASE = {"architectures": ["LlamaForCausalLM"], "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64,
        "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2}


@pytest.mark.parametrize("extra,needle", [
    ({"model_type": "mistral"}, "model_type 'mistral' is not supported"),
    ({"model_type": "qwen2"}, "model_type 'qwen2' is not supported"),
    ({"hidden_act": "gelu"}, "hidden_act 'gelu' is not supported"),
    ({"model_type": "llama", "hidden_act": "gelu_pytorch_tanh"}, "hidden_act 'gelu_pytorch_tanh' is not supported"),
])
def test_unsupported_model_type_or_activation_is_refused_in_one_line(extra, needle):
    with pytest.raises(ModelLoadError) as info:
        ModelConfig.from_dict({**BASE, **extra}, "m/config.json")
    message = str(info.value)
    assert needle in message and message.startswith("m/config.json: ") and "\n" not in message


@pytest.mark.parametrize("extra", [{}, {"model_type": "llama"}, {"hidden_act": "silu"},
                                   {"model_type": "llama", "hidden_act": "silu"}])
def test_llama_with_silu_or_fields_missing_is_accepted(extra):
    config = ModelConfig.from_dict({**BASE, **extra})
    assert config.num_layers == 1 and config.num_kv_heads == 2


def test_from_dir_names_the_file(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({**BASE, "model_type": "gemma"}))
    with pytest.raises(ModelLoadError, match=r"config\.json: model_type 'gemma' is not supported \(only llama\)"):
        ModelConfig.from_dir(tmp_path)
