"""Text a candidate controls, made safe to show and to store.

A kernel's error message, its printed output and an LLM's answer reach terminals (tables, progress
lines, logs), the PR body, the HTML report and the next prompt. `safe_text` makes every code point
that could act on a terminal or reorder what a reader sees visible as an escape: C0/C1 controls
(ESC starts CSI/OSC sequences, OSC 8 links, `\\r` and backspace overwrite), DEL, format characters
(bidi overrides and isolates U+202A-202E/U+2066-2069, zero-width characters, BOM), line and paragraph
separators, and lone surrogates (which also make an encoder raise). Everything else, non-ASCII
letters included, is kept as it is.
"""

from __future__ import annotations

import unicodedata
from typing import Any

_UNSAFE_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
_NAMED = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}
_CACHE: dict[str, bool] = {}  # code point -> unsafe (each one decided once)


def _unsafe(ch: str) -> bool:
    bad = _CACHE.get(ch)
    if bad is None:
        bad = _CACHE[ch] = unicodedata.category(ch) in _UNSAFE_CATEGORIES
    return bad


def _escape(ch: str) -> str:
    code = ord(ch)
    if ch in _NAMED:
        return _NAMED[ch]
    if code <= 0xFF:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def safe_text(value: Any, multiline: bool = False) -> str:
    """`str(value)` with every control, format and separator code point written as a visible escape
    (`\\x1b`, `\\u202e`, `\\r`). With `multiline`, newlines and tabs are kept (a traceback, a source
    file; a CRLF line end becomes a newline); otherwise they are escaped too, so the result is one line.
    Idempotent."""
    text = value if isinstance(value, str) else str(value)
    if text.isprintable():  # the common case: nothing to escape
        return text
    keep = "\n\t" if multiline else ""
    if multiline:
        text = text.replace("\r\n", "\n")
    return "".join(_escape(ch) if ch not in keep and _unsafe(ch) else ch for ch in text)



def storable_text(text: str) -> str:
    """`text` with lone surrogates replaced by U+FFFD, so that it encodes as UTF-8 (hashing, SQLite,
    files). A JSON answer may carry them ("\\ud83d" of a cut emoji); text without them is returned as is."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogatepass").decode("utf-8", "replace")
