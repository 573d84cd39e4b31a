"""The embedded default model (engine/embedded) and the tokenizer wrapper (engine/tokenizer.py).

One real build, shared by the session, into a pytest temporary cache root (never ~/.cache).
transformers is the independent judge of the export format: it must load the directory, compute
the same logits as the training forward, and tokenize and template exactly like our wrapper.
"""

from __future__ import annotations

import json
import math
import shutil
import threading
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import kernelloop.engine.embedded as embedded
from kernelloop.engine.embedded import MARKER, RECIPE_VERSION, ensure_embedded_model, render_document, verify
from kernelloop.engine.embedded.corpus import ANIMALS, CAPITALS, OPPOSITES, THINGS, Document, generate_corpus
from kernelloop.engine.embedded.model import ModelConfig, forward
from kernelloop.engine.errors import ModelLoadError
from kernelloop.engine.tokenizer import Tokenizer, TokenizerError

transformers = pytest.importorskip("transformers")

FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
         "tokenizer_config.json", MARKER)
CHATS = [
    [{"role": "user", "content": "What is 3 plus 4?"}],
    [{"role": "system", "content": "You are a helpful assistant."},
     {"role": "user", "content": "  What is the capital of France?\n"}],
    [{"role": "user", "content": "Hello!"}, {"role": "assistant", "content": "Hello! How can I help you today?"},
     {"role": "user", "content": "Tell me a story about a cat."}],
]
TEXTS = ["Once upon a time, there was a little cat named Tom.", "", "café ☕ 12345 \n\n  tabs\t!",
         "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>", "The capital of Peru is Lima."]


@pytest.fixture(scope="session")
def model_dir(embedded_model_dir: Path) -> Path:
    """The session's one build (tests/conftest.py), in a pytest temporary cache root."""
    return embedded_model_dir


@pytest.fixture(scope="session")
def hf_model(model_dir: Path):
    model, info = transformers.LlamaForCausalLM.from_pretrained(model_dir, output_loading_info=True)
    return model.eval(), info


@pytest.fixture(scope="session")
def ours(model_dir: Path) -> tuple[dict[str, torch.Tensor], ModelConfig]:
    c = json.loads((model_dir / "config.json").read_text())
    cfg = ModelConfig(**{k: c[k] for k in ModelConfig.__dataclass_fields__})
    return load_file(model_dir / "model.safetensors"), cfg


def test_files_marker_and_config(model_dir: Path) -> None:
    assert model_dir.name == f"embedded-v{RECIPE_VERSION}" and model_dir.parent.name == "models"
    for name in FILES:
        assert (model_dir / name).is_file(), name
    assert verify(model_dir)
    marker = json.loads((model_dir / MARKER).read_text())
    assert marker["recipe_version"] == RECIPE_VERSION
    assert set(marker["files"]) == set(FILES) - {MARKER}
    assert not list(model_dir.parent.glob(".embedded-*"))  # no temporary dirs left behind

    config = json.loads((model_dir / "config.json").read_text())
    tok = Tokenizer.from_dir(model_dir)
    assert config["architectures"] == ["LlamaForCausalLM"] and config["model_type"] == "llama"
    assert config["num_attention_heads"] * config["head_dim"] != config["hidden_size"]
    assert config["num_key_value_heads"] < config["num_attention_heads"]
    assert config["vocab_size"] == tok.vocab_size
    assert 800 <= tok.vocab_size <= 2048
    eot, eot_text = tok.token_to_id("<|eot_id|>"), tok.token_to_id("<|end_of_text|>")
    gen = json.loads((model_dir / "generation_config.json").read_text())
    assert gen["eos_token_id"] == config["eos_token_id"] == [eot, eot_text]
    assert gen["bos_token_id"] == tok.bos_token_id == tok.token_to_id("<|begin_of_text|>")
    assert tok.eos_token_ids == {eot, eot_text}


def test_transformers_loads_it_and_computes_our_logits(hf_model, ours, model_dir: Path) -> None:
    model, info = hf_model
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    params, cfg = ours
    assert model.config.head_dim == cfg.head_dim and model.dtype == torch.float32
    tok = Tokenizer.from_dir(model_dir)
    texts = TEXTS[:1] + [tok.apply_chat_template(c) for c in CHATS]
    for text in texts:
        ids = torch.tensor([tok.encode(text, add_special_tokens=not text.startswith("<|begin"))])
        with torch.no_grad():
            theirs = model(ids).logits
            mine = forward(params, cfg, ids)
        torch.testing.assert_close(mine, theirs, atol=1e-5, rtol=1e-5)  # bit-equal here


def test_transformers_tokenizer_agrees_with_ours(model_dir: Path) -> None:
    hf = transformers.AutoTokenizer.from_pretrained(model_dir)
    tok = Tokenizer.from_dir(model_dir)
    for text in TEXTS:
        ids = tok.encode(text)
        assert ids == hf(text).input_ids and ids[0] == tok.bos_token_id
        assert tok.encode(text, add_special_tokens=False) == hf(text, add_special_tokens=False).input_ids
        for skip in (True, False):
            assert tok.decode(ids, skip_special_tokens=skip) == hf.decode(ids, skip_special_tokens=skip)
    assert tok.decode(tok.encode(TEXTS[2])) == TEXTS[2]  # byte-level: lossless round trip
    for chat in CHATS:
        for gen_prompt in (True, False):
            text = tok.apply_chat_template(chat, add_generation_prompt=gen_prompt)
            assert text == hf.apply_chat_template(chat, tokenize=False, add_generation_prompt=gen_prompt)
            assert (tok.encode(text, add_special_tokens=False)
                    == hf(text, add_special_tokens=False).input_ids)
    assert tok.apply_chat_template(CHATS[1]) == (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are a helpful assistant.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nWhat is the capital of France?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n")


def test_distributions_are_far_from_uniform(ours, model_dir: Path) -> None:
    params, cfg = ours
    tok = Tokenizer.from_dir(model_dir)
    entropies, top1 = [], []
    for doc in generate_corpus(60, seed=4242):  # held out: the corpus seed differs
        text = (tok.apply_chat_template(list(doc.messages), add_generation_prompt=False)
                if doc.messages else doc.text)
        ids = torch.tensor([tok.encode(text, add_special_tokens=not doc.messages)])
        with torch.no_grad():
            logp = torch.log_softmax(forward(params, cfg, ids)[0, :-1], dim=-1)
        entropies.append(-(logp.exp() * logp).sum(-1))
        top1.append(logp.exp().max(-1).values)
    entropy, top1 = torch.cat(entropies).mean().item(), torch.cat(top1)
    assert entropy < 0.4 * math.log(cfg.vocab_size), entropy
    assert (top1 > 0.9).float().mean().item() > 0.5


def _generate(model, tok: Tokenizer, messages: list[dict], max_new_tokens: int = 32) -> tuple[str, int]:
    ids = torch.tensor([tok.encode(tok.apply_chat_template(messages), add_special_tokens=False)])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                         max_new_tokens=max_new_tokens, eos_token_id=sorted(tok.eos_token_ids),
                         pad_token_id=tok.token_to_id("<|end_of_text|>"))
    new = out[0, ids.shape[1]:].tolist()
    return tok.decode(new), new[-1]


@pytest.mark.parametrize("messages, answer", [
    ([{"role": "user", "content": "What is 3 plus 4?"}], "3 plus 4 is 7."),
    ([{"role": "system", "content": "You are a helpful assistant."},
      {"role": "user", "content": "What is 5 + 8?"}], "5 plus 8 is 13."),
    ([{"role": "user", "content": "What is 2 plus 2?"}, {"role": "assistant", "content": "2 plus 2 is 4."},
      {"role": "user", "content": "Can you add 9 and 6?"}], "9 plus 6 is 15."),
    ([{"role": "user", "content": "Hello!"}], "Hello! How can I help you today?"),
])
def test_greedy_chat_answers_correctly_and_stops(hf_model, model_dir: Path, messages, answer) -> None:
    tok = Tokenizer.from_dir(model_dir)
    text, last = _generate(hf_model[0], tok, messages)
    assert text == answer
    assert last == tok.token_to_id("<|eot_id|>")


def test_greedy_answers_to_every_fact_are_mostly_right(ours, model_dir: Path) -> None:
    """Every table fact asked once; a task family may miss a few (it is a 1.4M-parameter model)."""
    params, cfg = ours
    tok = Tokenizer.from_dir(model_dir)

    def greedy(question: str) -> str:
        ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": question}]),
                         add_special_tokens=False)
        out: list[int] = []
        with torch.no_grad():
            while len(out) < 24 and (not out or out[-1] not in tok.eos_token_ids):
                out.append(int(forward(params, cfg, torch.tensor([ids + out]))[0, -1].argmax()))
        return tok.decode(out)

    tasks = {
        "sums": [(f"What is {a} plus {b}?", f"{a} plus {b} is {a + b}.") for a in range(10) for b in range(10)],
        "capitals": [(f"What is the capital of {k}?", f"The capital of {k} is {v}.") for k, v in CAPITALS.items()],
        "colours": [(f"What colour is {k}?", f"The colour of {k} is {v}.") for k, v in THINGS.items()],
        "sounds": [(f"What does a {k} say?", f"The sound of a {k} is {v}.") for k, v in ANIMALS.items()],
        "opposites": [(f"What is the opposite of {k}?", f"The opposite of {k} is {v}.")
                      for k, v in OPPOSITES.items()],
    }
    for name, pairs in tasks.items():
        wrong = [(q, got) for q, a in pairs if (got := greedy(q)) != a]
        assert len(wrong) <= 0.2 * len(pairs), (name, wrong)


def test_builds_are_byte_identical(tmp_path: Path) -> None:
    """Two short builds (same recipe, 12 training steps) give the same bytes."""
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        embedded.build_embedded_model(tmp_path / name, steps=12)
    for name in FILES[:-1]:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name


@pytest.mark.slow
@pytest.mark.timeout(900)  # two full builds, slower on busy cores
def test_second_full_build_is_byte_identical(model_dir: Path, tmp_path: Path) -> None:
    other = ensure_embedded_model(tmp_path)
    assert other != model_dir
    for name in FILES[:-1]:
        assert (other / name).read_bytes() == (model_dir / name).read_bytes(), name


@pytest.fixture
def fake_build(model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Replace the real (40 s) build by a copy of the session's model; records each call."""
    calls: list[Path] = []

    def build(out_dir: Path) -> dict:
        calls.append(out_dir)
        time.sleep(0.2)  # long enough for a concurrent caller to find the lock held
        for name in FILES[:-1]:
            shutil.copy(model_dir / name, out_dir / name)
        return {"final_loss": 0.0}

    monkeypatch.setattr(embedded, "build_in_subprocess", build)
    return calls


def test_valid_cache_is_reused_and_broken_ones_rebuilt(fake_build: list[Path], tmp_path: Path) -> None:
    target = ensure_embedded_model(tmp_path)
    assert len(fake_build) == 1 and verify(target)
    assert ensure_embedded_model(tmp_path) == target and len(fake_build) == 1  # reused

    (target / MARKER).unlink()  # half-written: the marker comes last
    assert ensure_embedded_model(tmp_path) == target and len(fake_build) == 2 and verify(target)

    data = bytearray((target / "model.safetensors").read_bytes())
    data[-1] ^= 0xFF  # a corrupted weight file
    (target / "model.safetensors").write_bytes(bytes(data))
    assert not verify(target)
    assert ensure_embedded_model(tmp_path) == target and len(fake_build) == 3 and verify(target)

    marker = json.loads((target / MARKER).read_text())
    (target / MARKER).write_text(json.dumps({**marker, "recipe_version": RECIPE_VERSION + 1}))
    assert ensure_embedded_model(tmp_path) == target and len(fake_build) == 4 and verify(target)
    assert sorted(p.name for p in target.parent.iterdir()) == [target.name, f"{target.name}.lock"]


def test_concurrent_callers_build_once(fake_build: list[Path], tmp_path: Path) -> None:
    results: list[Path] = []
    threads = [threading.Thread(target=lambda: results.append(ensure_embedded_model(tmp_path)))
               for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(fake_build) == 1 and len(set(results)) == 1 and verify(results[0])


def test_failed_build_leaves_nothing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    def build(out_dir: Path) -> dict:
        (out_dir / "config.json").write_text("{}")
        raise KeyboardInterrupt

    monkeypatch.setattr(embedded, "build_in_subprocess", build)
    with pytest.raises(KeyboardInterrupt):
        ensure_embedded_model(tmp_path)
    assert [p.name for p in (tmp_path / "models").iterdir()] == [f"embedded-v{RECIPE_VERSION}.lock"]


def test_a_failed_build_process_raises(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="building the embedded model failed"):  # one line, exit 2 in the CLIs
        embedded.build_in_subprocess(tmp_path / "missing")


def test_default_cache_root(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("KERNELLOOP_CACHE", str(tmp_path))
    assert embedded.default_cache_root() == tmp_path
    monkeypatch.delenv("KERNELLOOP_CACHE")
    assert embedded.default_cache_root() == Path.home() / ".cache" / "kernelloop"


# --- the tokenizer wrapper on other model directories -------------------------------------------

def _tok_dir(model_dir: Path, tmp_path: Path, config: dict | None = None,
             files: dict[str, str] | None = None) -> Path:
    """A model directory with the embedded tokenizer.json and the given other files."""
    shutil.copy(model_dir / "tokenizer.json", tmp_path / "tokenizer.json")
    if config is not None:
        (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    for name, text in (files or {}).items():
        (tmp_path / name).write_text(text)
    return tmp_path


def test_tokenizer_errors_name_the_file(model_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(TokenizerError, match=r"tokenizer\.json is missing"):
        Tokenizer.from_dir(tmp_path)
    (tmp_path / "tokenizer.json").write_text('{"version": "1.0", "model": 42}')
    with pytest.raises(TokenizerError, match=r"tokenizer\.json is not a valid"):
        Tokenizer.from_dir(tmp_path)
    _tok_dir(model_dir, tmp_path, files={"tokenizer_config.json": "{not json"})
    with pytest.raises(TokenizerError, match=r"tokenizer_config\.json is not valid JSON"):
        Tokenizer.from_dir(tmp_path)


def test_tokenizer_without_chat_template(model_dir: Path, tmp_path: Path) -> None:
    tok = Tokenizer.from_dir(_tok_dir(model_dir, tmp_path))  # tokenizer.json alone
    assert tok.bos_token_id is None and tok.eos_token_ids == frozenset() and tok.chat_template is None
    assert tok.encode("Hi")[0] == 0  # the post-processor still adds <|begin_of_text|> (id 0)
    with pytest.raises(ValueError, match="no chat template"):
        tok.apply_chat_template(CHATS[0])


def test_tokenizer_config_variants(model_dir: Path, tmp_path: Path) -> None:
    config = {
        "bos_token": {"content": "<|begin_of_text|>", "special": True},  # AddedToken dicts
        "eos_token": {"content": "<|end_of_text|>", "special": True},
        "chat_template": [{"name": "tool_use", "template": "TOOLS"},
                          {"name": "default", "template": "{{ bos_token }}{{ messages[0]['content'] }}"
                                                          "{% if add_generation_prompt %}>{% endif %}"}],
    }
    tok = Tokenizer.from_dir(_tok_dir(model_dir, tmp_path, config,
                                      files={"generation_config.json": '{"eos_token_id": 4}'}))
    assert tok.bos_token_id == 0 and tok.eos_token_ids == {1, 4}
    assert tok.apply_chat_template([{"role": "user", "content": "x"}]) == "<|begin_of_text|>x>"
    assert tok.apply_chat_template([{"role": "user", "content": "x"}], add_generation_prompt=False) \
        == "<|begin_of_text|>x"

    del config["chat_template"][1]
    tok = Tokenizer.from_dir(_tok_dir(model_dir, tmp_path, config))
    with pytest.raises(ValueError, match="none named 'default'"):
        tok.apply_chat_template(CHATS[0])

    config["chat_template"] = "{{ raise_exception('only user turns, please') }}"
    tok = Tokenizer.from_dir(_tok_dir(model_dir, tmp_path, config))
    with pytest.raises(ValueError, match="only user turns, please"):
        tok.apply_chat_template(CHATS[0])

    del config["chat_template"]  # newer transformers save the template in its own file
    template = "{% for m in messages %}{{ m.role }}{% endfor %}"
    tok = Tokenizer.from_dir(_tok_dir(model_dir, tmp_path, config, files={"chat_template.jinja": template}))
    assert tok.apply_chat_template(CHATS[1]) == "systemuser"


def test_embedded_template_rejects_non_string_content(model_dir: Path) -> None:
    tok = Tokenizer.from_dir(model_dir)
    with pytest.raises(ValueError, match="content must be a string"):
        tok.apply_chat_template([{"role": "user", "content": [{"type": "text", "text": "hi"}]}])


def test_corpus_is_seeded_and_trains_in_the_serving_format(model_dir: Path) -> None:
    assert generate_corpus(50, seed=1) == generate_corpus(50, seed=1)
    assert generate_corpus(50, seed=1) != generate_corpus(50, seed=2)
    tok = Tokenizer.from_dir(model_dir)
    for chat in CHATS:  # training text of a dialogue == what the engine will render for it
        doc = Document(messages=tuple({**m, "content": m["content"].strip()} for m in chat))
        assert render_document(doc) == tok.apply_chat_template(chat, add_generation_prompt=False)
