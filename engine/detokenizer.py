"""Incremental detokenization with stop strings, for streaming; and each token's own bytes
(`TokenBytes`, for logprobs).

Decoding each token alone and concatenating is wrong for real tokenizers: SentencePiece-style
decoders drop the leading space of the first token they see, byte-level and byte-fallback tokens
can hold part of a UTF-8 character. So, as vLLM and TGI do, we decode a short window of ids:

- `prefix_offset..read_offset` are ids whose text was already produced (the context);
- each push decodes `ids[prefix_offset:]` and the new text is what follows the context's text;
- while that new text ends in U+FFFD (an incomplete UTF-8 sequence) the offsets stay put and the
  text is held back; once it is complete the window slides (`prefix_offset = read_offset`,
  `read_offset = len(ids)`).

Characters before a trailing U+FFFD are final (UTF-8 is self-synchronising), so they take part in
stop-string matching and may be emitted early; only the U+FFFD run itself waits.

Stop strings: the text emitted never contains a stop string or anything after it, and text that
could still be the start of a stop string is held back until it either completes the stop string
(generation stops there) or diverges (the text is emitted after all). With several stop strings,
the first one to appear while streaming wins; among those completed by the same token, the one
that starts earliest (the shortest on a tie).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from functools import lru_cache

_REPLACEMENT = "\ufffd"
_CONTEXT_IDS = 5  # prompt ids decoded as context before the first generated token


class IncrementalDetokenizer:
    """Streams the text of generated ids, cut at the first stop string.

    `decode` maps ids to text (e.g. a tokenizer's decode); `stop` are the stop strings (empty
    ones ignored); `prefix_ids` are the prompt ids, used only as decoding context.
    """

    def __init__(
        self,
        decode: Callable[[list[int]], str],
        stop: Sequence[str] = (),
        prefix_ids: list[int] | None = None,
    ) -> None:
        self._decode = decode
        self._stops = [s for s in stop if s]
        self._ids: list[int] = list(prefix_ids or [])
        self._read_offset = len(self._ids)
        self._prefix_offset = max(self._read_offset - _CONTEXT_IDS, 0)
        self._prefix_text = self._decode_window(self._prefix_offset, self._read_offset)
        self._committed = ""  # generated text whose ids are behind read_offset
        self._pending = ""  # text of ids after read_offset (may end in U+FFFD)
        self._emitted = 0  # characters of the generated text returned so far
        self.stopped = False
        self.stop_reason: str | None = None

    @property
    def text(self) -> str:
        """All text emitted so far."""
        return (self._committed + self._pending)[: self._emitted]

    def push(self, token_id: int) -> str:
        """Add one generated id; return the new text that is safe to emit ("" once stopped)."""
        if self.stopped:
            return ""
        self._ids.append(token_id)
        window = self._decode_window(self._prefix_offset, len(self._ids))
        pending = window[len(self._prefix_text) :]
        if pending and not pending.endswith(_REPLACEMENT):
            # Complete text: slide the window.
            self._committed += pending
            self._pending = ""
            self._prefix_offset, self._read_offset = self._read_offset, len(self._ids)
            self._prefix_text = self._decode_window(self._prefix_offset, self._read_offset)
        else:
            self._pending = pending
        stable = self._committed + self._pending.rstrip(_REPLACEMENT)
        return self._advance(stable, final=False)

    def flush(self) -> str:
        """End of generation: return the held-back rest (cut at a stop string if one is there)."""
        if self.stopped:
            return ""
        return self._advance(self._committed + self._pending, final=True)

    def _decode_window(self, start: int, end: int) -> str:
        return self._decode(self._ids[start:end]) if end > start else ""

    def _advance(self, text: str, final: bool) -> str:
        """Emit text[emitted:limit] where limit is a stop match or the start of a possible one."""
        start = self._emitted
        best: tuple[int, int, str] | None = None  # (position, length, stop string)
        for s in self._stops:
            pos = text.find(s, start)
            if pos >= 0 and (best is None or (pos, len(s)) < best[:2]):
                best = (pos, len(s), s)
        if best is not None:
            self.stopped, self.stop_reason = True, best[2]
            limit = best[0]
        elif final:
            limit = len(text)
        else:
            limit = self._hold_from(text, start)
        out = text[start:limit]
        self._emitted = limit
        return out

    def _hold_from(self, text: str, start: int) -> int:
        """Earliest position >= start from which the rest of text is a prefix of a stop string."""
        longest = max((len(s) for s in self._stops), default=0)
        for pos in range(max(start, len(text) - longest + 1), len(text)):
            tail = text[pos:]
            if any(s.startswith(tail) for s in self._stops):
                return pos
        return len(text)


# -- one token's own bytes (logprobs) ---------------------------------------------------------------

_BYTE_FALLBACK = re.compile(r"<0x([0-9A-Fa-f]{2})>")


@lru_cache(maxsize=1)
def byte_level_decoder() -> dict[str, int]:
    """GPT-2's byte-level table, reversed: the printable character that stands for each byte in
    byte-level BPE vocabularies (Llama 3, GPT-2, Qwen...) -> that byte."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


class TokenBytes:
    """The bytes of one token on its own, for logprobs' `bytes` field.

    Decoding a single token that holds part of a multi-byte UTF-8 character gives U+FFFD, whose
    bytes are not the token's. For such tokens the bytes come from the vocabulary itself: a
    byte-level BPE token string maps to bytes through GPT-2's byte table, a byte-fallback token
    (`<0xE4>`, SentencePiece) is that byte. Tokens that decode to complete text are their text's
    UTF-8 (this covers special and added tokens, which are not byte-mapped).

    `tokenizer` needs `decode(ids, skip_special_tokens=...)` and `id_to_token(id)`.
    """

    def __init__(self, tokenizer) -> None:
        self._tok = tokenizer
        self._cache: dict[int, bytes] = {}

    def __call__(self, token_id: int) -> bytes:
        out = self._cache.get(token_id)
        if out is None:
            out = self._cache[token_id] = self._bytes(token_id)
        return out

    def _bytes(self, token_id: int) -> bytes:
        text = self._tok.decode([token_id], skip_special_tokens=False)
        if _REPLACEMENT not in text:
            return text.encode("utf-8")
        piece = self._tok.id_to_token(token_id)
        if piece is None:
            return text.encode("utf-8")
        if m := _BYTE_FALLBACK.fullmatch(piece):
            return bytes([int(m.group(1), 16)])
        table = byte_level_decoder()
        if piece and all(c in table for c in piece):
            return bytes(table[c] for c in piece)
        return text.encode("utf-8")  # a token that really is U+FFFD, or a vocabulary we cannot map
