"""Projections served by a quantization scheme: the part of the Dispatcher that knows about scopes.

A scope is one projection of the model, named as the engine names its parameters ("layers.3.down_proj",
"lm_head"). Which scheme a scope uses comes from the registry's scoped entries for this device and dtype
(agent quantize commits them) or from a plan set in process (`Dispatcher.set_quant_plan`, how agent
quantize measures a selection before committing it; a plan wins over the registry). Each scope's weight
is quantized once (kernels/quant.py) and kept while that tensor is unchanged; the call goes through a
dispatch of the scheme's op for that scope, so its registry entry, demotion and fallbacks work as for any
op (the fallbacks being the scheme op's baseline and reference: a failing kernel never silently serves the
unquantized weight the gate did not measure).
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Mapping

import torch

from kernelloop.kernels.quant import SCHEME_OF_OP, Scheme, scheme
from kernelloop.kernels.registry.entry import Entry
from kernelloop.kernels.spec import OpSpec, dtype_name

log = logging.getLogger(__name__)

QuantizedWeight = tuple[torch.Tensor, torch.Tensor]  # (qweight, scales)


class Projections:
    """scope -> (the scheme's op dispatch for that scope, the scheme), and each scope's quantized weight.

    `make_dispatch(spec, scope)` builds the per-scope dispatch (kernels/dispatch.py OpDispatch)."""

    def __init__(self, ops: Mapping[str, OpSpec], make_dispatch: Callable[[OpSpec, str], Any], fingerprint: str) -> None:
        self._ops = ops
        self._make = make_dispatch
        self._fingerprint = fingerprint  # the dispatcher's device, as entries name it
        self.plan: dict[str, Scheme] = {}
        self._from_registry: dict[str, dict[str, Scheme]] = {}  # dtype name -> scope -> scheme
        self._entries: list[Entry] = []
        self._dispatch: dict[tuple[str, str], Any] = {}  # (scope, op) -> OpDispatch
        self._weights: dict[tuple[str, str], tuple[tuple[int, int, tuple[int, ...]], QuantizedWeight]] = {}
        self._missing: set[str] = set()

    def set_entries(self, entries: list[Entry]) -> bool:
        """The registry entries now served (at load and at each reload; then `re_resolve`). True when the
        scoped ones changed (a scope quantized, dropped or given another scheme or kernel)."""
        before = self._entries
        self._entries = [e for e in entries if e.scope]
        self._from_registry = {}
        return sorted(e.key + (e.sha256,) for e in before) != sorted(e.key + (e.sha256,) for e in self._entries)

    @property
    def scoped_entries(self) -> int:
        return len(self._entries)

    def set_plan(self, plan: Mapping[str, str]) -> None:
        """scope -> scheme name, served in place of (and on top of) the registry's scoped entries."""
        self.plan = {s: scheme(name) for s, name in plan.items()}

    def served(self, scope: str, dtype: torch.dtype) -> tuple[Any, Scheme] | None:
        """The dispatch and scheme serving `scope` for inputs of `dtype`; None: the unscoped linear serves."""
        chosen = self.plan.get(scope) or self._registry_schemes(dtype_name(dtype)).get(scope)
        if chosen is None:
            return None
        spec = self._ops.get(chosen.op)
        if spec is None:
            if chosen.op not in self._missing:
                self._missing.add(chosen.op)
                log.error("op %s is not in this engine's op table; its scopes serve unquantized", chosen.op)
            return None
        key = (scope, chosen.op)
        op = self._dispatch.get(key)
        if op is None:
            op = self._dispatch[key] = self._make(spec, scope)
        return op, chosen

    def quantized(self, scope: str, chosen: Scheme, weight: torch.Tensor) -> QuantizedWeight:
        """`weight` in `chosen`'s storage, computed once per weight tensor (its storage, version and shape)."""
        ident = (weight.data_ptr(), weight._version, tuple(weight.shape))
        held = self._weights.get((scope, chosen.name))
        if held is not None and held[0] == ident:
            return held[1]
        q = chosen.quantize(weight)
        self._weights[(scope, chosen.name)] = (ident, q)
        return q

    def variants_in_use(self) -> dict[str, dict[str, str]]:
        """"op@scope" -> {"dtype bucket": variant} for every scoped dispatch used so far."""
        return {f"{op}@{scope}": d.variants_in_use() for (scope, op), d in self._dispatch.items()}

    def re_resolve(self) -> dict[str, dict[str, tuple[str, str]]]:
        changed = {f"{op}@{scope}": d.re_resolve() for (scope, op), d in self._dispatch.items()}
        return {name: c for name, c in changed.items() if c}

    def _registry_schemes(self, dtype: str) -> dict[str, Scheme]:
        if dtype not in self._from_registry:
            chosen: dict[str, Scheme] = {}
            for e in sorted(self._entries, key=lambda e: e.key):
                if e.device == self._fingerprint and e.dtype == dtype and e.op in SCHEME_OF_OP:
                    chosen[e.scope] = SCHEME_OF_OP[e.op]
            self._from_registry[dtype] = chosen
        return self._from_registry[dtype]
