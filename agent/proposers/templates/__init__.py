"""Structural templates of the search proposer: one module per op, each rendering candidate source text.

Every op module exports:

- ``OP``: the op name;
- ``DOMAINS``: ``{template: {param: [values in order]}}``, the values a parameter may take (the order
  defines which values are "near" each other when the search looks at a config's neighbours);
- ``space(ctx) -> list[dict]``: the configs worth measuring for a `TuneContext` (its shapes and
  device), each ``{"template": name, param: value, ...}``, most promising first within a template;
- ``render(params) -> str``: a complete, self-contained candidate module (docs/ARCHITECTURE.md,
  "Candidate format") whose first line is the JSON header written by `header_line`.

Sources use only torch (allocation, views, copies) and triton; every load and store is masked and
loaded values are widened to float32 before any arithmetic.
"""

from __future__ import annotations

import json
from types import ModuleType
from typing import Any, Iterable, Mapping, Sequence

HEADER_PREFIX = "# kernelloop-search: "
OP_NAMES = ("rmsnorm", "fused_add_rmsnorm", "silu_mul", "rope", "decode_attention", "linear", "extend_attention")


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
    return getattr(ctx, "device", "cuda") != "cpu"


def module_for(op: str) -> ModuleType:
    """The template module of `op`; KeyError for an op without templates."""
    if op == "rmsnorm":
        from . import rmsnorm as m
    elif op == "fused_add_rmsnorm":
        from . import fused_add_rmsnorm as m
    elif op == "silu_mul":
        from . import silu_mul as m
    elif op == "rope":
        from . import rope as m
    elif op == "decode_attention":
        from . import decode_attention as m
    elif op == "linear":
        from . import linear as m
    elif op == "extend_attention":
        from . import extend_attention as m
    else:
        raise KeyError(f"no search templates for op {op!r}")
    return m
