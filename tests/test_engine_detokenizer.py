"""IncrementalDetokenizer with real `tokenizers` tokenizers built in the test (no downloads)."""

from __future__ import annotations

import random

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from kernelloop.engine.detokenizer import IncrementalDetokenizer

CORPUS = [
    "Hello world, the café in 日本 serves crème brûlée 🍰🎉.",
    "STOP here. The end. 日本語のテキストです。",
    "naïve façade — déjà vu ✨ and the world ends <end> ok",
    "def main():\n    return 42  # ümlaut Ωmega",
]


@pytest.fixture(scope="module")
def byte_bpe() -> Tokenizer:
    """A GPT-2/Llama-3 style byte-level BPE trained on a tiny corpus: some tokens are partial chars."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator(CORPUS * 10, trainer)
    return tok


SP_WORDS = ["▁Hello", "▁world", "▁the", "Hel", "lo", "▁", "!", "▁STOP", "ST", "OP", ".", "▁end", "ing", "é"]


@pytest.fixture(scope="module")
def sp_bpe() -> tuple[Tokenizer, dict[str, int]]:
    """A Llama-2 style tokenizer: '▁' marks spaces, byte fallback, the decoder strips one leading space."""
    vocab = {"<unk>": 0}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for w in SP_WORDS:
        vocab[w] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], byte_fallback=True, unk_token="<unk>"))
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    return tok, vocab


def run(tok: Tokenizer, ids: list[int], stop=(), prefix_ids=None) -> tuple[list[str], str, IncrementalDetokenizer]:
    d = IncrementalDetokenizer(tok.decode, stop, prefix_ids=prefix_ids)
    chunks = [d.push(i) for i in ids]
    return chunks, d.flush(), d


# ---------------------------------------------------------------- no stop strings


def test_random_ids_concatenate_to_full_decode(byte_bpe):
    rng = random.Random(0)
    n_vocab = byte_bpe.get_vocab_size()
    partial = 0
    for _ in range(300):
        ids = [rng.randrange(n_vocab) for _ in range(rng.randint(1, 30))]
        chunks, rest, d = run(byte_bpe, ids)
        assert "".join(chunks) + rest == byte_bpe.decode(ids), ids
        assert not any(c.endswith("\ufffd") for c in chunks), "emitted an incomplete character"
        assert not d.stopped and d.stop_reason is None
        partial += any(byte_bpe.decode([i]).endswith("\ufffd") for i in ids)
    assert partial > 50, "the random sequences should include partial UTF-8 tokens"


def test_encoded_text_streams_without_replacement_chars(byte_bpe):
    for text in CORPUS + ["🍰🎉✨ 日本 é"]:
        ids = byte_bpe.encode(text).ids
        chunks, rest, _ = run(byte_bpe, ids)
        assert "".join(chunks) == text and rest == ""
        assert all("\ufffd" not in c for c in chunks)
        # Some token of the multi-byte text is a partial character, so some push returned "".
    ids = byte_bpe.encode("🍰").ids
    assert len(ids) > 1 and run(byte_bpe, ids)[0][:-1] == [""] * (len(ids) - 1)


def test_incomplete_tail_is_returned_by_flush(byte_bpe):
    ids = byte_bpe.encode("ok 🍰").ids[:-1]
    chunks, rest, _ = run(byte_bpe, ids)
    assert "".join(chunks) == "ok "
    assert rest.endswith("\ufffd") and "".join(chunks) + rest == byte_bpe.decode(ids)


def test_window_decode_keeps_spaces_between_tokens(sp_bpe):
    tok, vocab = sp_bpe
    ids = [vocab[w] for w in ["▁Hello", "▁world", "!", "▁the", "▁end", "ing", "."]]
    per_token = "".join(tok.decode([i]) for i in ids)
    chunks, rest, _ = run(tok, ids)
    assert per_token == "Helloworld!theending."  # why per-token concatenation is wrong
    assert "".join(chunks) + rest == "Hello world! the ending." == tok.decode(ids)
    assert chunks[1] == " world"


def test_sentencepiece_random_words_and_byte_fallback(sp_bpe):
    tok, vocab = sp_bpe
    words = [vocab[w] for w in SP_WORDS]
    rng = random.Random(1)
    for _ in range(200):
        ids = [rng.choice(words) for _ in range(rng.randint(1, 15))]
        chunks, rest, _ = run(tok, ids)
        assert "".join(chunks) + rest == tok.decode(ids)
    nichi = [vocab[f"<0x{b:02X}>"] for b in "日".encode()]
    ids = [vocab["▁Hello"], vocab["▁"], *nichi, vocab["!"]]
    chunks, rest, _ = run(tok, ids)
    assert chunks == ["Hello", " ", "", "", "日", "!"] and rest == ""


def test_prefix_ids_give_context(sp_bpe):
    tok, vocab = sp_bpe
    prompt = [vocab["▁the"], vocab["▁Hello"]]
    ids = [vocab["▁world"], vocab["!"]]
    chunks, rest, _ = run(tok, ids, prefix_ids=prompt)
    assert chunks == [" world", "!"] and rest == ""  # the leading space survives with context
    assert run(tok, ids)[0] == ["world", "!"]  # without context it is the start of the text


# ---------------------------------------------------------------- stop strings


def test_stop_spanning_tokens_is_cut_exactly(byte_bpe):
    text = "Hello world, the café in 日本 serves crème brûlée 🍰🎉. more after"
    stop = "crème brûlée"
    ids = byte_bpe.encode(text).ids
    assert not any(stop in byte_bpe.decode([i]) for i in ids)  # it spans several tokens
    d = IncrementalDetokenizer(byte_bpe.decode, [stop])
    out = []
    for n, i in enumerate(ids):  # noqa: B007  (n: where it stopped, read below)
        out.append(d.push(i))
        if d.stopped:
            break
    assert d.stopped and d.stop_reason == stop
    assert "".join(out) == text[: text.index(stop)] == d.text
    assert stop[0] not in "".join(out)[len("Hello world, the café in 日本 serves "):]
    assert n < len(ids) - 1
    assert [d.push(i) for i in ids[n + 1 :]] == [""] * (len(ids) - n - 1)
    assert d.flush() == ""


def test_stop_prefix_is_held_then_released(byte_bpe):
    d = IncrementalDetokenizer(byte_bpe.decode, ["STOP"])
    first = "".join(d.push(i) for i in byte_bpe.encode("say ST").ids)
    assert first == "say "  # "ST" could start "STOP"
    second = "".join(d.push(i) for i in byte_bpe.encode("ILL here").ids)
    assert first + second == "say STILL here"
    assert not d.stopped and d.flush() == ""
    d = IncrementalDetokenizer(byte_bpe.decode, ["STOP"])
    held = "".join(d.push(i) for i in byte_bpe.encode("end ST").ids)
    assert held == "end " and d.flush() == "ST"  # generation ended: the held text is released


def test_stop_found_before_an_incomplete_character(byte_bpe):
    ids = byte_bpe.encode("say STOP🍰").ids
    d = IncrementalDetokenizer(byte_bpe.decode, ["STOP"])
    out = ""
    for i in ids[:-1]:  # the emoji is still incomplete
        out += d.push(i)
    assert d.stopped and out == "say "


def test_stop_at_start(byte_bpe):
    chunks, rest, d = run(byte_bpe, byte_bpe.encode("STOP here").ids, stop=["STOP"])
    assert chunks == [""] * len(chunks) and rest == "" and d.stop_reason == "STOP"


def test_multiple_stop_strings_earliest_wins(byte_bpe):
    text = "the café in the world ends"
    ids = byte_bpe.encode(text).ids
    for stops in (["world", "café"], ["café", "world"]):
        chunks, rest, d = run(byte_bpe, ids, stop=stops)
        assert "".join(chunks) + rest == "the " and d.stop_reason == "café"
    # Both completed by the same token: the one that starts first wins.
    ids = byte_bpe.encode("in the world").ids
    assert byte_bpe.decode(ids[-1:]) == " world"  # one token completes both stop strings
    chunks, rest, d = run(byte_bpe, ids, stop=["world", "he world"])
    assert d.stop_reason == "he world" and "".join(chunks) + rest == "in t" == d.text


def test_random_stop_strings_cut_at_first_occurrence(byte_bpe):
    rng = random.Random(2)
    n_vocab = byte_bpe.get_vocab_size()
    checked = 0
    for _ in range(300):
        ids = [rng.randrange(n_vocab) for _ in range(rng.randint(2, 25))]
        full = byte_bpe.decode(ids)
        start = rng.randrange(len(full))
        stop = full[start : start + rng.randint(1, 6)]
        if not stop:
            continue
        chunks, rest, d = run(byte_bpe, ids, stop=[stop, "\x00never\x00"])
        assert d.stopped and d.stop_reason == stop
        assert "".join(chunks) + rest == full[: full.index(stop)] == d.text
        checked += 1
    assert checked > 250


def test_empty_stop_strings_ignored(byte_bpe):
    ids = byte_bpe.encode("plain text").ids
    chunks, rest, d = run(byte_bpe, ids, stop=[""])
    assert "".join(chunks) + rest == "plain text" and not d.stopped
