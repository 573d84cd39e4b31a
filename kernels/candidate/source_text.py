"""The text of a candidate must read as it runs: no invisible or reordering characters, no encoding
other than UTF-8.

Refused anywhere in the text, comments and strings included (Trojan Source, CVE-2021-42574):
format characters (Unicode category Cf: bidirectional overrides and isolates U+202A-202E and
U+2066-2069, zero-width spaces and joiners, U+2060, the soft hyphen, a byte-order mark anywhere but
the very start, ...), control characters other than tab, newline, form feed and a carriage return
that ends a line (CRLF),
line and paragraph separators (U+2028/U+2029: a line break for an editor, not for Python), and bytes
that are not UTF-8 (`read_source` keeps them as lone surrogates so that they are seen here, rather
than judging a replaced text). Identifiers are ASCII: Python folds look-alike letters (NFKC) into
one name, and letters that look alike but differ make two. A PEP 263 coding cookie other than UTF-8
is refused: the file would run differently imported from disk than its decoded text compiled.
Reasons name the line and the code point (U+202E), never the character itself.
"""

from __future__ import annotations

import codecs
import io
import re
import tokenize
import unicodedata
from pathlib import Path

_REFUSED_CATEGORIES = {"Cc": "control character", "Cf": "invisible format character",
                       "Zl": "line separator", "Zp": "paragraph separator"}
_COOKIE = re.compile(r"^[ \t\f]*#.*?coding[:=][ \t]*([-\w.]+)", re.ASCII)
_LINE_END = re.compile(r"\r\n|\r|\n")
_SUSPECT = re.compile(r"[^\t\n\r\f\x20-\x7e]|\r(?!\n)")  # not printable ASCII or an allowed control; a bare CR


def read_source(path: str | Path) -> str:
    """A candidate file's text: UTF-8 (a leading byte-order mark dropped, as Python's import does),
    with any byte that is not UTF-8 kept as a lone surrogate (U+DC80-U+DCFF), which `text_problem`
    refuses by its line and byte."""
    return Path(path).read_bytes().decode("utf-8-sig", errors="surrogateescape")  # a leading BOM dropped, as import does


def _line_of(source: str, offset: int) -> int:
    return len(_LINE_END.findall(source, 0, offset)) + 1


def _describe(ch: str) -> str:
    name = unicodedata.name(ch, "")
    return f"U+{ord(ch):04X}" + (f" ({name})" if name else "")


def _character_problem(source: str) -> tuple[int, str] | None:
    for match in _SUSPECT.finditer(source):
        offset, ch = match.start(), match.group()
        if ch == "\r":
            return _line_of(source, offset), ("a carriage return (U+000D) that does not end a line is not allowed "
                                              "(a terminal draws what follows it over the start of the line)")
        category = unicodedata.category(ch)
        if ch == "\ufeff" and offset == 0:
            continue  # a byte-order mark where one belongs
        if category == "Cs":
            if 0xDC80 <= ord(ch) <= 0xDCFF:
                return _line_of(source, offset), f"byte 0x{ord(ch) - 0xDC00:02X} is not UTF-8 (the file must be UTF-8 text)"
            return _line_of(source, offset), f"lone surrogate {_describe(ch)} is not text"
        what = _REFUSED_CATEGORIES.get(category)
        if what:
            return _line_of(source, offset), (f"{what} {_describe(ch)} is not allowed anywhere in the source "
                                              "(it can make the text read differently from how it runs)")
    return None


def _cookie_problem(source: str) -> tuple[int, str] | None:
    for number, line in enumerate(_LINE_END.split(source.removeprefix("\ufeff"), maxsplit=2)[:2], 1):
        match = _COOKIE.match(line)
        if not match:
            continue
        name = match.group(1)
        try:
            ok = codecs.lookup(name).name == "utf-8"
        except LookupError:
            ok = False
        if not ok:
            return number, (f"coding cookie {name!r} is not allowed (only utf-8): imported from disk the file "
                            "would decode differently from the text that is checked")
    return None


def _identifier_problem(source: str) -> tuple[int, str] | None:
    try:
        for token in tokenize.generate_tokens(io.StringIO(source).readline):
            if token.type == tokenize.NAME and not token.string.isascii():
                ch = next(c for c in token.string if not c.isascii())
                return token.start[0], (f"identifier with the non-ASCII character {_describe(ch)} is not allowed "
                                        "(look-alike letters make names that read alike but differ, or differ but "
                                        "are one): use ASCII names")
    except (tokenize.TokenError, SyntaxError):
        return None  # the parser reports it
    return None


def text_problem(source: str) -> tuple[int, str] | None:
    """(line, reason) for the first problem of the text itself, or None."""
    found = [p for p in (_character_problem(source), _cookie_problem(source)) if p]
    if not found and not source.isascii():
        found = [p for p in (_identifier_problem(source),) if p]
    return min(found, key=lambda p: p[0]) if found else None
