"""The text of a candidate reads as it runs: invisible and reordering characters,
control characters, look-alike identifiers, coding cookies other than UTF-8 and bytes that are not
UTF-8 are refused, with the line and the code point named and the character itself never shown.
Honest text (non-ASCII prose in comments and strings, a leading byte-order mark, form feeds, CRLF,
a utf-8 cookie) passes.
"""

from __future__ import annotations

import pytest

from kernelloop.kernels.candidate.source_text import read_source, text_problem
from kernelloop.kernels.candidate.static_check import static_check

from tests.sandbox_support import ARGS, FORWARD, HEADER

BODY = "def f(x):\n    return x  # a comment\n"


def _refused(source: str) -> str:
    result = static_check(source, ARGS)
    assert not result.ok, "accepted"
    assert result.reason.isascii() and result.reason.isprintable(), repr(result.reason)
    return result.reason


@pytest.mark.parametrize("char, name", [
    ("\u202e", "U+202E (RIGHT-TO-LEFT OVERRIDE)"),
    ("\u202a", "U+202A"), ("\u202b", "U+202B"), ("\u202c", "U+202C"), ("\u202d", "U+202D"),
    ("\u2066", "U+2066 (LEFT-TO-RIGHT ISOLATE)"), ("\u2067", "U+2067"), ("\u2068", "U+2068"),
    ("\u2069", "U+2069 (POP DIRECTIONAL ISOLATE)"),
    ("\u200b", "U+200B (ZERO WIDTH SPACE)"), ("\u200c", "U+200C"), ("\u200d", "U+200D"),
    ("\u2060", "U+2060 (WORD JOINER)"), ("\u00ad", "U+00AD (SOFT HYPHEN)"), ("\u200e", "U+200E"),
    ("\u061c", "U+061C"), ("\U000e0041", "U+E0041 (TAG LATIN CAPITAL LETTER A)"),
    ("\x1b", "U+001B"), ("\x00", "U+0000"), ("\x08", "U+0008"), ("\x7f", "U+007F"), ("\x85", "U+0085"),
    ("\x0b", "U+000B"), ("\u2028", "U+2028 (LINE SEPARATOR)"), ("\u2029", "U+2029 (PARAGRAPH SEPARATOR)"),
])
@pytest.mark.parametrize("where", ["comment", "string", "docstring"])
def test_invisible_and_control_characters_are_refused_anywhere(char: str, name: str, where: str) -> None:
    line = {"comment": f"x = 1  # note{char} here\n", "string": f"s = 'a{char}b'\n",
            "docstring": f'def g():\n    """Doc{char}."""\n'}[where]
    reason = _refused(HEADER + line + FORWARD)
    assert reason.startswith(f"line {5 if where == 'docstring' else 4}:") and name in reason, reason


def test_a_byte_order_mark_is_allowed_only_first(tmp_path) -> None:
    path = tmp_path / "bom.py"
    path.write_bytes(b"\xef\xbb\xbf" + (HEADER + BODY + FORWARD).encode())
    assert read_source(path) == HEADER + BODY + FORWARD  # dropped as import drops it
    assert static_check(read_source(path), ARGS).ok
    reason = _refused(HEADER + "x = '\ufeff'\n" + FORWARD)
    assert reason.startswith("line 4:") and "U+FEFF" in reason


def test_the_line_counts_every_kind_of_line_end() -> None:
    for end in ("\n", "\r\n"):
        source = (HEADER + "a = 1\n# \u202e\n" + FORWARD).replace("\n", end)
        assert _refused(source).startswith("line 5:")
    assert static_check((HEADER + BODY + FORWARD).replace("\n", "\r\n"), ARGS).ok


@pytest.mark.parametrize("line", ["x = 1  # fine\ry = 2\n", "s = 'a\rb'\n", "# shown\r# hidden = 1\n"])
def test_a_carriage_return_that_ends_no_line_is_refused(line: str) -> None:
    reason = _refused(HEADER + line + FORWARD)
    assert reason.startswith("line 4:") and "carriage return (U+000D)" in reason, reason


@pytest.mark.parametrize("name", ["\uff45ps", "w\u0435ight", "\u0455cale", "x\u00b2", "\u212bngstrom"])
def test_identifiers_are_ascii(name: str) -> None:
    # fullwidth e (folds into `eps`), Cyrillic e and dze (look like Latin), superscript two, Angstrom sign
    reason = _refused(HEADER + f"def g(eps):\n    {name} = 1e-2\n    return eps\n" + FORWARD)
    assert reason.startswith("line 5:") and "non-ASCII" in reason, reason


def test_non_ascii_prose_in_comments_and_strings_passes() -> None:
    source = HEADER + "# \u00b5s per call, \u2264 4 \u00d7 faster, caf\u00e9, \u65e5\u672c\nunit = '\u00b5s \u2192 \u00b0C'\n"
    source += "\f\n" + BODY + FORWARD
    assert static_check(source, ARGS).ok, static_check(source, ARGS).reason


@pytest.mark.parametrize("cookie", ["latin-1", "iso-8859-15", "utf-16", "cp1252", "utf-7", "ascii", "utf-8-sig",
                                    "no-such-codec"])
@pytest.mark.parametrize("form", ["# coding: {}", "# -*- coding: {} -*-", "# vim: set fileencoding={} :"])
@pytest.mark.parametrize("line", [1, 2])
def test_coding_cookies_other_than_utf8_are_refused(cookie: str, form: str, line: int) -> None:
    cookie_line = form.format(cookie) + "\n"
    source = cookie_line + HEADER + FORWARD if line == 1 else "#!/usr/bin/env python\n" + cookie_line + HEADER + FORWARD
    reason = _refused(source)
    assert reason.startswith(f"line {line}:") and "coding cookie" in reason and cookie in reason, reason


@pytest.mark.parametrize("cookie", ["utf-8", "utf8", "UTF-8", "utf_8", "U8"])
def test_utf8_cookies_pass(cookie: str) -> None:
    assert static_check(f"# -*- coding: {cookie} -*-\n" + HEADER + FORWARD, ARGS).ok


def test_a_cookie_on_line_three_is_not_one() -> None:
    assert static_check("# a\n# b\n# coding: latin-1\n" + HEADER + FORWARD, ARGS).ok


def test_bytes_that_are_not_utf8_are_refused_by_line_and_byte(tmp_path) -> None:
    path = tmp_path / "cand.py"
    path.write_bytes((HEADER + "s = 'caf").encode() + b"\xe9\xff'\n" + FORWARD.encode())
    source = read_source(path)
    reason = _refused(source)
    assert reason.startswith("line 4:") and "byte 0xE9 is not UTF-8" in reason, reason
    assert static_check(path.read_bytes(), ARGS).reason == reason  # bytes are judged the same way


def test_valid_utf8_files_read_as_they_are(tmp_path) -> None:
    path = tmp_path / "cand.py"
    text = HEADER + "# caf\u00e9 \u2264\n" + FORWARD
    path.write_text(text, encoding="utf-8")
    assert read_source(path) == text and text_problem(text) is None
