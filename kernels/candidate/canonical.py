"""The one text of a candidate that runs: the sandbox's runner, replayer and compile process and the
engine's registry loader all execute `canonical(source).text`, and linecache holds only that text.

Triton does not run a kernel's code object: it re-reads the kernel's text through
`inspect.getsourcelines` and builds the kernel again from it. Its interpreter starts at the *last*
line of that text whose stripped form starts with `def `; compiled Triton at the *first* line
matching `^def\\s+\\w+\\s*\\(` after dedent. Text that a reader (and the static check) takes for a
docstring, a string or a decorator argument could become the body that runs.

The canonical text is `ast.unparse` of the parsed source with docstrings dropped (they are inert):
no comments, one line per simple statement, decorators on one line, ordinary strings as escaped
one-line literals. `canonical()` refuses (CanonicalError, one line) a source that
- does not parse or compile;
- unparses to a program other than the one parsed (less its docstrings): the checked program;
- in the source as written or in the canonical text, would let either of Triton's rules build a
  function from text other than the definition the AST has (for every def at any depth: a kernel
  can be built from any function object).
"""

from __future__ import annotations

import ast
import functools
import hashlib
import inspect
import re
import textwrap
import types
from dataclasses import dataclass
from typing import Iterator

_COMPILED_DEF = re.compile(r"^def\s+\w+\s*\(", re.MULTILINE)  # triton/runtime/jit.py JITFunction.__init__
_FINDSOURCE = re.compile(r"^(\s*def\s)|(\s*async\s+def\s)|(.*(?<!\w)lambda(:|\s))|^(\s*@)")  # inspect.findsource


class CanonicalError(ValueError):
    """The source cannot be turned into one text that every path runs the same way."""


@dataclass(frozen=True)
class Canonical:
    text: str          # what is executed, everywhere
    sha256: str        # of `text`
    tree: ast.Module   # ast.parse(text), with the text's own line numbers

    @property
    def label(self) -> str:
        """The file name the text is compiled and cached under (the same in the judge and the engine)."""
        return f"<kernelloop_kernel {self.sha256[:12]}>"


def canonical(source: str) -> Canonical:
    """The canonical text of `source`, or CanonicalError saying why there is none. Each call gets a
    tree of its own; the text (or the refusal) is remembered for the last few sources."""
    if not isinstance(source, str):
        raise CanonicalError("the source is not text")
    text_or_error = _text_of(source)
    if isinstance(text_or_error, CanonicalError):
        raise CanonicalError(str(text_or_error))
    return Canonical(text_or_error, hashlib.sha256(text_or_error.encode()).hexdigest(), ast.parse(text_or_error))


@functools.lru_cache(maxsize=16)
def _text_of(source: str) -> str | CanonicalError:
    try:
        return _canonical(source)
    except CanonicalError as exc:
        return CanonicalError(str(exc))  # without the traceback, which holds the source's frames
    except (SyntaxError, ValueError) as exc:  # ValueError: null bytes
        line = f"line {exc.lineno}: " if isinstance(exc, SyntaxError) and exc.lineno else ""
        return CanonicalError(f"{line}the source does not compile: {getattr(exc, 'msg', None) or exc}")
    except (RecursionError, MemoryError) as exc:
        return CanonicalError(f"the source is too deeply nested or too large to canonicalise ({type(exc).__name__})")


def canonical_problem(source: str) -> str | None:
    """Why `source` has no canonical text (one line), or None: for the judge's static verdict."""
    try:
        canonical(source)
    except CanonicalError as exc:
        return str(exc)
    except Exception as exc:  # noqa: BLE001 (a check never stops the judge: its failure is the verdict)
        return f"the source cannot be canonicalised ({type(exc).__name__})"
    return None


def _canonical(source: str) -> str:
    tree = ast.parse(source)
    problem = extraction_problem(source, tree, "<kernelloop source as written>")
    if problem:
        raise CanonicalError(f"{problem} (in the source as written)")
    checked = strip_docstrings(ast.parse(source))
    text = ast.unparse(checked) + "\n"
    again = ast.parse(text)
    if ast.dump(again) != ast.dump(checked):
        raise CanonicalError("the canonical text does not parse back to the checked program")
    problem = extraction_problem(text, again, "<kernelloop canonical text>")
    if problem:
        raise CanonicalError(f"{problem} (in the canonical text)")
    return text


def strip_docstrings(tree: ast.Module) -> ast.Module:
    """`tree`, changed in place: without module, class and function docstrings (an emptied body gets `pass`)."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                node.body = node.body[1:] or [ast.copy_location(ast.Pass(), first)]
    return tree


def extraction_problem(text: str, tree: ast.Module, label: str) -> str | None:
    """Where Triton's interpreter or compiled rule would build some def of `text` from other text than
    the def itself; None when every def is built from its own text or cannot be built at all.

    The text of each def is what `inspect.getsourcelines` gives Triton for the code object that
    compiling `text` makes."""
    defs: dict[tuple[str, int], ast.FunctionDef | ast.AsyncFunctionDef] = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            defs[(node.name, first)] = node
    code = compile(tree, label, "exec", dont_inherit=True)  # also: what parses but cannot run (`return` at top)
    lines = text.splitlines(keepends=True)
    parsed: dict[str | None, ast.FunctionDef | None] = {}  # the two rules often take the same text
    for fn_code in _function_codes(code):
        node = defs.get((fn_code.co_name, fn_code.co_firstlineno))
        if node is None:
            continue  # a lambda or a comprehension: neither rule yields a def from its text
        problem = _rules_disagree(node, *source_lines(lines, fn_code.co_firstlineno), parsed)
        if problem:
            return f"line {node.lineno}: {problem}"
    return None


def source_lines(lines: list[str], first_line: int) -> tuple[list[str], int]:
    """`inspect.getsourcelines(fn)` for a function whose code starts at `first_line` of `lines`
    (inspect.findsource's walk back to a def/lambda/decorator line, then inspect.getblock), without
    the sys.modules scan inspect does to find the function's module."""
    lnum = first_line - 1
    while lnum > 0:
        if lnum >= len(lines):
            return [], 0
        if _FINDSOURCE.match(lines[lnum]):
            break
        lnum -= 1
    try:
        return inspect.getblock(lines[lnum:]), lnum + 1
    except (SyntaxError, IndentationError):
        return [], 0


def _function_codes(code: types.CodeType) -> Iterator[types.CodeType]:
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            if const.co_flags & inspect.CO_OPTIMIZED:  # a function (class bodies are not)
                yield const
            yield from _function_codes(const)


def interpreter_text(lines: list[str]) -> tuple[str, int]:
    """What Triton's interpreter (FunctionRewriter) parses: from the last `def ` line, dedented; and
    the index in `lines` it starts at."""
    start = 0
    for i, line in enumerate(lines):
        if line.strip().startswith("def "):
            start = i + 1
    start = start - 1 if start else len(lines) - 1  # no def line: Triton takes lines[-1:]
    return textwrap.dedent("".join(lines[start:])), start


def compiled_text(lines: list[str]) -> tuple[str | None, int]:
    """What compiled Triton (JITFunction) parses: from the first `def name(` after dedent; and the
    index in `lines` it starts at."""
    src = textwrap.dedent("".join(lines))
    match = _COMPILED_DEF.search(src)
    if match is None:
        return None, 0
    return src[match.start():], src.count("\n", 0, match.start())


def _single_def(text: str | None) -> ast.FunctionDef | None:
    if text is None:
        return None
    try:
        body = ast.parse(text).body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    return body[0] if len(body) == 1 and isinstance(body[0], ast.FunctionDef) else None


def _rules_disagree(node: ast.FunctionDef | ast.AsyncFunctionDef, lines: list[str], first: int,
                    parsed: dict[str | None, ast.FunctionDef | None]) -> str | None:
    """A def parsed from the text a rule takes is the node itself when it spans the node's own lines
    (the same text parses to the same def); `first`: the line number of lines[0]."""
    # The interpreter execs whatever it parsed and returns the def named like the function; compiled
    # Triton takes the one def it parsed, whatever its name. Text that is not one def builds nothing.
    for rule, (text, start) in (("Triton's interpreter", interpreter_text(lines)), ("compiled Triton", compiled_text(lines))):
        if text not in parsed:
            parsed[text] = _single_def(text)
        got = parsed[text]
        if got is None or (rule == "Triton's interpreter" and got.name != node.name):
            continue
        where = first + start + got.lineno - 1
        if (where, first + start + got.end_lineno - 1) != (node.lineno, node.end_lineno) or isinstance(node, ast.AsyncFunctionDef):
            return (f"{rule} would build {node.name!r} from the `def {got.name}` text at line {where}, "
                    "not from its definition")
    return None
