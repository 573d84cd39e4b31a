"""Structural templates of the search proposer: one module per op, each rendering candidate source text.

The template modules are discovered (`modules()`): every module of this package, and the `templates`
module (or package) of each op package named in $KERNELLOOP_OP_PACKAGES (kernels/ops/__init__.py),
that names its op in `OP`. Every template module exports:

- ``OP``: the op name;
- ``DOMAINS``: ``{template: {param: [values in order]}}``, the values a parameter may take (the order
  defines which values are "near" each other when the search looks at a config's neighbours);
- ``space(ctx) -> list[dict]``: the configs worth measuring for a `TuneContext` (its shapes and
  device), each ``{"template": name, param: value, ...}``, most promising first within a template;
- ``render(params) -> str``: a complete, self-contained candidate module (docs/ARCHITECTURE.md,
  "Candidate format") whose first line is the JSON header written by `header_line`.

A template whose kernel is the op's baseline with other constants renders the baseline kernel file
itself (`from_baseline`): one text for the baseline, the LLM's example and that template. Sources use
only torch (allocation, views, copies) and triton; every load and store is masked and loaded values
are widened to float32 before any arithmetic.
"""

from __future__ import annotations

import ast
import functools
import importlib
import json
import pkgutil
from types import ModuleType
from typing import Any, Iterable, Mapping, Sequence

from kernelloop.kernels.device import CUDA

HEADER_PREFIX = "# kernelloop-search: "


def header_line(op: str, params: Mapping[str, Any]) -> str:
    """``# kernelloop-search: {"op": ..., "template": ..., <params in template order>}``."""
    body = {"op": op, "template": params["template"]}
    body.update((k, v) for k, v in params.items() if k != "template")
    return HEADER_PREFIX + json.dumps(body)


def parse_header(source: str | None) -> dict[str, Any] | None:
    """The header's JSON object (op, template, params) from the first header line of `source`, else None."""
    if not source:
        return None
    for line in source.splitlines():
        if line.startswith(HEADER_PREFIX):
            try:
                value = json.loads(line[len(HEADER_PREFIX):])
            except ValueError:
                return None
            if isinstance(value, dict) and isinstance(value.get("op"), str) and isinstance(value.get("template"), str):
                return value
            return None
    return None


def config_of(header: Mapping[str, Any]) -> dict[str, Any]:
    """A header without its "op": the params dict `render` takes."""
    return {k: v for k, v in header.items() if k != "op"}


def next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def shape_max(shapes: Iterable[Mapping[str, int]], *keys: str) -> int | None:
    """The largest value of any of `keys` over `shapes`, None when no shape has one."""
    values = [int(s[k]) for s in shapes for k in keys if k in s]
    return max(values) if values else None


def pick(values: Sequence[Any], full: bool, default: Any) -> list[Any]:
    """`values` on a real GPU; only `default` where the choice cannot matter (the CPU interpreter
    ignores num_warps and num_stages, so sweeping them there only costs sandbox runs)."""
    return list(values) if full else [default]


def gpu_choices(ctx: Any) -> bool:
    return not getattr(ctx, "device", CUDA).interpreted


def check_params(op: str, params: Mapping[str, Any], domains: Mapping[str, Mapping[str, Sequence[Any]]]) -> None:
    """ValueError unless `params` names a template of `domains` and gives each of its params a listed value."""
    domain = domains.get(params.get("template"))
    if domain is None:
        raise ValueError(f"{op}: unknown template {params.get('template')!r}")
    if set(params) - {"template"} != set(domain):
        raise ValueError(f"{op}: template {params['template']} takes {sorted(domain)}, got {sorted(params)}")
    for k, v in params.items():
        if k != "template" and v not in domain[k]:
            raise ValueError(f"{op}: {k}={v!r} is outside {domain[k]}")


def set_constants(source: str, values: Mapping[str, Any]) -> str:
    """`source` with the value of each top-level one-line assignment `NAME = ...` named in `values`
    replaced by the value's repr (the rest of the line, a comment, stays)."""
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    edits = []
    for name, value in values.items():
        found = [n.value for n in tree.body if isinstance(n, ast.Assign)
                 and [getattr(t, "id", None) for t in n.targets] == [name]]
        if len(found) != 1 or found[0].lineno != found[0].end_lineno:
            raise ValueError(f"no single one-line top-level assignment `{name} = ...` to set")
        edits.append((found[0].lineno - 1, found[0].col_offset, found[0].end_col_offset, repr(value)))
    for line, start, end, text in sorted(edits, reverse=True):
        lines[line] = lines[line][:start] + text + lines[line][end:]
    return "".join(lines)


def from_baseline(op: str, params: Mapping[str, Any], constants: Mapping[str, Any]) -> str:
    """The op's baseline kernel file (kernels/ops/<op>_kernel.py) with `constants` set, headed by the
    header line of `params`: a template whose kernel is the baseline's."""
    from kernelloop.kernels.ops import baseline_source

    return header_line(op, params) + "\n" + set_constants(baseline_source(op), constants)


@functools.cache
def modules() -> dict[str, ModuleType]:
    """The template module of every op that has one, by op name, in the op table's order."""
    from kernelloop.kernels.ops import OPS, TEMPLATES, extra_packages

    found: dict[str, ModuleType] = {}
    for name in (__name__, *(f"{p}.{TEMPLATES}" for p in extra_packages())):
        try:
            root = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:
                continue  # an op package without templates
            raise
        children = ([importlib.import_module(i.name) for i in pkgutil.iter_modules(root.__path__, name + ".")]
                    if hasattr(root, "__path__") else [root])
        for module in children:
            op = getattr(module, "OP", None)
            if not isinstance(op, str) or not callable(getattr(module, "render", None)):
                continue
            if found.get(op, module) is not module:
                raise ValueError(f"two template modules for op {op!r}: {found[op].__name__} and {module.__name__}")
            found[op] = module
    return {op: found[op] for op in OPS if op in found}


def module_for(op: str) -> ModuleType:
    """The template module of `op`; KeyError for an op without templates."""
    try:
        return modules()[op]
    except KeyError:
        raise KeyError(f"no search templates for op {op!r}") from None


def __getattr__(name: str) -> Any:
    if name == "OP_NAMES":  # the ops with templates, derived (for callers that want a tuple)
        return tuple(modules())
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
