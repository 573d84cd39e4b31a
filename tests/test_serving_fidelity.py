"""Serving fidelity: what a real client sees matches what the engine really does.

- /v1/models reports the request length the KV cache can really serve; --max-model-len;
- chat logprobs carry each token's own bytes, also for tokens holding part of a UTF-8 character;
- streamed completions continue `text_offset` across chunks;
- several --served-model-name ids, responses echo the one asked for;
- unsupported configs (hidden_act) and --threads on the command line;
- the prefix cache holds a prompt from the end of its prefill, not only once its request finishes.
"""

from __future__ import annotations

import dataclasses
import json
import shutil

import httpx
import pytest
import torch

from kernelloop.engine.cli import build_parser, main
from kernelloop.engine.detokenizer import TokenBytes
from kernelloop.engine.engine import Engine, EngineConfig
from kernelloop.engine.sampling import SamplingParams
from kernelloop.engine.scheduler import SchedulerConfig

from tests.hf_checkpoints import make_checkpoint
from tests.serving import serve

NAMES = ["tiny-llama", "alias"]
PER_SLOT = 2 * 2 * 2 * 16 * 4  # gqa checkpoint: K and V, 2 layers, 2 kv heads, head_dim 16, float32
KV_TOKENS = 299  # 300 slots, slot 0 reserved


@pytest.fixture(scope="module")
def gqa(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("fidelity") / "gqa", "gqa")


@pytest.fixture(scope="module")
def server(gqa):
    """The gqa checkpoint (1024 positions) under a KV budget of 300 slots, served as two names."""
    with serve(Engine(EngineConfig(model=str(gqa), kv_cache_bytes=PER_SLOT * (KV_TOKENS + 1))), NAMES) as running:
        yield running


def openai_client(base: str):
    from openai import OpenAI

    return OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=60)


# -- 1. max_model_len ---------------------------------------------------------------------------------


def test_models_report_what_the_kv_cache_can_serve(server):
    client = openai_client(server[0])
    lengths = [m.model_extra["max_model_len"] for m in client.models.list().data]
    assert lengths == [KV_TOKENS, KV_TOKENS]  # not min(1024 positions, 8192)
    # ... and that is exactly what a request can have: prompt + output.
    done = client.completions.create(model=NAMES[0], prompt=[5] * (KV_TOKENS - 1), max_tokens=50, temperature=0,
                                     extra_body={"ignore_eos": True})
    assert done.usage.total_tokens == KV_TOKENS and done.choices[0].finish_reason == "length"
    r = httpx.post(f"{server[0]}/v1/completions", json={"model": NAMES[0], "prompt": [5] * KV_TOKENS}, timeout=30)
    assert r.status_code == 400 and "prompt has" in r.json()["error"]["message"]


@pytest.fixture(scope="module")
def long_positions(gqa, tmp_path_factory):
    """The gqa weights with 16384 positions (rope needs no weights), so the KV budget binds first."""
    path = tmp_path_factory.mktemp("fidelity") / "long"
    shutil.copytree(gqa, path)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 16384}))
    return path


@pytest.mark.parametrize("argv,needle", [
    (["--max-model-len", "5000"], "more than the model's 1024 positions"),
    (["--max-model-len", "1"], "at least 2"),
    (["--max-model-len", "4000", "--kv-cache-mb", "1", "LONG"], "does not fit the KV cache, which holds 2047 tokens"),
    (["--max-model-len", "8"], "the prompt has 10 tokens; this engine serves at most 7"),
])
def test_max_model_len_errors_are_one_line_and_exit_2(capsys, gqa, long_positions, argv, needle):
    model = str(long_positions) if "LONG" in argv else str(gqa)
    argv = [a for a in argv if a != "LONG"]
    assert main(["generate", " ".join(f"w{i}" for i in range(5, 15)), "--model", model, *argv]) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1, err


def test_max_model_len_within_limits_is_served(capsys, long_positions):
    assert main(["generate", "w5 w6 w7", "--model", str(long_positions), "--kv-cache-mb", "1",
                 "--max-model-len", "2000", "--max-tokens", "2"]) == 0
    assert len(capsys.readouterr().out.split()) == 2
    engine = Engine(EngineConfig(model=str(long_positions), kv_cache_bytes=1 << 20))  # default: lowered to fit
    assert engine.max_model_len == 2047 and engine.max_context == 8192


# -- 2. chat logprobs bytes -----------------------------------------------------------------------------

BYTE_TEXTS = ["hello world 你好 世界 🙂 café naïve"] * 50 + ["the cat sat on the mat 猫"] * 30


@pytest.fixture(scope="module")
def byte_level(tmp_path_factory):
    """A tiny random Llama with a byte-level BPE (the embedded model's recipe, 300 ids): "你好" is
    ['ä', '½ł', 'å¥½'], so its first character is split across two tokens."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from kernelloop.engine.embedded.bpe import tokenizer_config, train_tokenizer

    path = tmp_path_factory.mktemp("fidelity") / "bytes"
    tok = train_tokenizer(BYTE_TEXTS, 300)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=tok.get_vocab_size(), hidden_size=48, intermediate_size=112, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=1024,
        tie_word_embeddings=True, bos_token_id=0, eos_token_id=4)).eval()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # peaked next-token distributions, as tests/hf_checkpoints.py draws them
        for name, p in model.named_parameters():
            scale = 1.0 if "embed_tokens" in name else 1.5 / p.shape[-1] ** 0.5
            p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g) if name.endswith("norm.weight")
                    else torch.randn(p.shape, generator=g) * scale)
    model.save_pretrained(path)
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps(tokenizer_config()))
    return path


def gpt2_bytes(tokenizer, token_id: int) -> bytes:
    """A byte-level token's bytes, through transformers' own copy of GPT-2's table."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    table = {c: b for b, c in bytes_to_unicode().items()}
    return bytes(table[c] for c in tokenizer.id_to_token(token_id))


def test_token_bytes_of_a_character_split_across_tokens(byte_level):
    engine_tok = Engine(EngineConfig(model=str(byte_level))).tokenizer
    ids = engine_tok.encode("你好", add_special_tokens=False)
    token_bytes = TokenBytes(engine_tok)
    assert [token_bytes(i) for i in ids] == [b"\xe4", b"\xbd\xa0", "好".encode()]
    assert engine_tok.decode(ids[:1]) == "\ufffd"  # what the token text alone can say
    assert token_bytes(engine_tok.token_to_id("<|eot_id|>")) == b"<|eot_id|>"

    class SentencePiece:  # byte-fallback pieces: <0xE4> is the byte 0xE4
        def decode(self, ids, skip_special_tokens=True):
            return "\ufffd" if ids == [7] else "▁x"

        def id_to_token(self, i):
            return "<0xE4>" if i == 7 else "▁x"

    assert TokenBytes(SentencePiece())(7) == b"\xe4"


def test_chat_logprobs_bytes_are_each_tokens_own_plain_and_streamed(byte_level):
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True, logprobs=5)
    messages = [{"role": "user", "content": "你好 🙂 猫"}]
    reference = Engine(EngineConfig(model=str(byte_level)))  # its own engine: no prefix-cache hit
    tok = reference.tokenizer
    ids = tok.encode(tok.apply_chat_template(messages), add_special_tokens=False)
    expected = reference.generate([ids], params)[0]
    sampled = [gpt2_bytes(tok, t) for t in expected.output_ids]
    tops = [[gpt2_bytes(tok, t) for t, _ in lp.top] for lp in expected.logprobs]
    partial = [b for b in sampled + sum(tops, []) if not _is_utf8(b)]
    assert partial, "the test means to cover tokens holding part of a UTF-8 character"

    with serve(Engine(EngineConfig(model=str(byte_level))), "bytes") as (base, _):
        client = openai_client(base)
        kwargs = dict(model="bytes", messages=messages, max_tokens=24, temperature=0, logprobs=True,
                      top_logprobs=5, extra_body={"ignore_eos": True})
        plain = client.chat.completions.create(**kwargs).choices[0].logprobs.content
        streamed = [e for c in client.chat.completions.create(**kwargs, stream=True)
                    if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    for content in (plain, streamed):
        assert [bytes(e.bytes) for e in content] == sampled
        assert [[bytes(t.bytes) for t in e.top_logprobs] for e in content] == tops
    assert b"".join(sampled).decode("utf-8", "replace") == tok.decode(expected.output_ids, skip_special_tokens=False)


def _is_utf8(b: bytes) -> bool:
    try:
        b.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


# -- 3. streamed text_offset -----------------------------------------------------------------------------


def test_streamed_completion_text_offsets_continue_across_chunks(server):
    client = openai_client(server[0])
    kwargs = dict(model=NAMES[0], prompt="w5 w17 w9 w30 w44", max_tokens=8, temperature=0, logprobs=2,
                  extra_body={"ignore_eos": True})
    full = client.completions.create(**kwargs).choices[0].logprobs
    chunks = [c.choices[0].logprobs for c in client.completions.create(**kwargs, stream=True)
              if c.choices and c.choices[0].logprobs]
    assert sum((lp.tokens for lp in chunks), []) == full.tokens
    assert sum((lp.text_offset for lp in chunks), []) == full.text_offset
    assert full.text_offset == sorted(set(full.text_offset)) and full.text_offset[0] == 0


def test_echo_is_refused_whatever_the_prompt_form(server):
    for prompt in ("w5 w6", ["w5 w6"], [5, 6]):
        r = httpx.post(f"{server[0]}/v1/completions", json={"model": NAMES[0], "prompt": prompt, "echo": True,
                                                            "max_tokens": 1}, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["param"] == "echo", prompt


# -- 4. several served names ----------------------------------------------------------------------------------


def test_several_served_model_names(server):
    from openai import NotFoundError

    client = openai_client(server[0])
    assert [m.id for m in client.models.list().data] == NAMES
    for name in NAMES:
        assert client.completions.create(model=name, prompt="w5 w6", max_tokens=2).model == name
        chunks = list(client.chat.completions.create(model=name, messages=[{"role": "user", "content": "w7"}],
                                                     max_tokens=2, stream=True))
        assert chunks and {c.model for c in chunks} == {name}
    with pytest.raises(NotFoundError) as info:
        client.completions.create(model="other", prompt="w5", max_tokens=1)
    assert info.value.body["code"] == "model_not_found"
    assert build_parser().parse_args(["serve", "--served-model-name", "a", "b"]).served_model_name == ["a", "b"]
    assert build_parser().parse_args(["serve", "--served-model-name", "a"]).served_model_name == ["a"]


# -- 5. unsupported configs ---------------------------------------------------------------------------------------


def test_unsupported_hidden_act_is_one_line_and_exit_2(capsys, gqa, tmp_path):
    path = tmp_path / "gelu"
    shutil.copytree(gqa, path)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "hidden_act": "gelu"}))
    assert main(["generate", "w5", "--model", str(path)]) == 2
    err = capsys.readouterr().err
    assert "hidden_act" in err and "gelu" in err and err.count("\n") == 1, err


# -- 6. --threads ---------------------------------------------------------------------------------------------------


def test_threads_are_set_before_the_engine_is_built(capsys, monkeypatch, gqa):
    import kernelloop.engine.engine as engine_module

    events: list = []
    monkeypatch.setattr(torch, "set_num_threads", lambda n: events.append(("intra", n)))
    monkeypatch.setattr(torch, "set_num_interop_threads", lambda n: events.append(("interop", n)))
    build = engine_module.Engine.__init__

    def init(self, *args, **kwargs):
        events.append("engine")
        build(self, *args, **kwargs)

    monkeypatch.setattr(engine_module.Engine, "__init__", init)
    assert main(["generate", "w5 w6", "--model", str(gqa), "--max-tokens", "1", "--threads", "3"]) == 0
    assert events == [("intra", 3), ("interop", 3), "engine"]
    events.clear()
    assert main(["generate", "w5 w6", "--model", str(gqa), "--max-tokens", "1"]) == 0
    assert events == ["engine"]  # default: torch's own
    capsys.readouterr()
    assert main(["generate", "w5", "--model", str(gqa), "--threads", "0"]) == 2
    err = capsys.readouterr().err
    assert "--threads must be at least 1" in err and err.count("\n") == 1
    assert build_parser().parse_args(["serve", "--threads", "2"]).threads == 2


# -- 7. the prefix cache from the end of prefill ---------------------------------------------------------------------


def no_leak(engine: Engine) -> None:
    assert engine.cache.protected_size() == 0, "a lock was not dropped"
    assert engine.allocator.available() + engine.cache.total_size() == engine.allocator.num_slots - 1, "slots leaked"


@pytest.mark.parametrize("chunk_size", [2048, 16])
def test_a_prompt_is_shared_while_its_request_still_decodes(gqa, chunk_size):
    config = EngineConfig(model=str(gqa), scheduler=SchedulerConfig(chunk_size=chunk_size))
    engine = Engine(config)
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(3, 211, (60,), generator=g).tolist()
    greedy = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True, logprobs=2)
    a = engine.add_request(prompt, greedy)
    engine.step()
    if chunk_size == 16:  # a chunk is cached (and locked) as soon as it is computed
        assert engine.cache.protected_size() == 16 and a.cached_len == 16
        while not a.output_ids:
            engine.step()
    engine.step()  # A decodes
    assert not a.finished and engine.cache.protected_size() == 60
    b = engine.add_request(prompt + [7, 8, 9], dataclasses.replace(greedy, max_tokens=6))
    while not (a.finished and b.finished):
        engine.step()
    assert b.cached_tokens == 60 and engine.stats["cached_prompt_tokens"] == 60
    no_leak(engine)
    alone = Engine(config).generate([prompt + [7, 8, 9]], dataclasses.replace(greedy, max_tokens=6))[0]
    assert b.output_ids == alone.output_ids
    assert [lp.logprob for lp in b.logprobs] == pytest.approx([lp.logprob for lp in alone.logprobs], abs=1e-4)


@pytest.mark.parametrize("prefix_cache", [True, False])
def test_identical_prompts_in_one_prefill_share_slots_without_double_frees(gqa, prefix_cache):
    engine = Engine(EngineConfig(model=str(gqa), prefix_cache=prefix_cache))
    prompt = list(range(10, 50))
    greedy = SamplingParams(max_tokens=5, temperature=0, ignore_eos=True)
    first = engine.add_request(prompt, greedy)
    second = engine.add_request(prompt, greedy)
    engine.step()  # one prefill for both: the second's KV duplicates the first's
    if prefix_cache:
        assert first.cached_len == second.cached_len == 40
        assert torch.equal(engine.rows.read(first.row, 40), engine.rows.read(second.row, 40))
        used = engine.allocator.num_slots - 1 - engine.allocator.available()
        assert used == 40, "the duplicate slots were not freed"
    while not (first.finished and second.finished):
        engine.step()
    assert first.output_ids == second.output_ids
    no_leak(engine)
    third = engine.generate([prompt + [3]], greedy)[0]
    assert third.cached_tokens == (40 if prefix_cache else 0)
    no_leak(engine)
