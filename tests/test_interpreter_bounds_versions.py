"""The memory-safety layer (kernels/interpreter_bounds.py) across Triton versions: it wraps the interpreter's
memory entry points as each supported Triton spells them, and refuses one it does not know (an unchecked run
believed checked is worse than none). The checks themselves: tests/test_memory_safety.py."""

from __future__ import annotations

import pytest

from kernelloop.kernels import interpreter_bounds as bounds


def _triton36_builder() -> type:
    """A fresh class (install() wraps the methods in place) with InterpreterBuilder's memory entry points as
    Triton 3.6 spells them (the H200 image's Triton)."""
    return type("Builder", (_Triton36Methods,), {})


class _Triton36Methods:

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def create_masked_load(self, ptrs, mask, other, cache_modifier, eviction_policy, is_volatile):
        self.calls.append(("load", cache_modifier, eviction_policy, is_volatile))

    def create_masked_store(self, ptrs, value, mask, cache_modifier, eviction_policy):
        self.calls.append(("store", cache_modifier, eviction_policy))

    def create_atomic_rmw(self, rmwOp, ptr, val, mask, sem, scope):  # noqa: N803
        self.calls.append(("rmw",))

    def create_atomic_cas(self, ptr, cmp, val, sem, scope):
        self.calls.append(("cas",))


def test_triton_36s_signatures_are_wrapped_and_an_unknown_one_refused(monkeypatch):
    from triton.runtime import interpreter

    class Launch:
        def __init__(self) -> None:
            self.checked: list[str] = []

        def check(self, ptrs, mask, kind):
            self.checked.append(kind)

    cls = _triton36_builder()
    monkeypatch.setattr(interpreter, "InterpreterBuilder", cls)
    monkeypatch.setattr(bounds, "_INSTALLED", [])
    bounds.install()
    builder, launch = cls(), Launch()
    monkeypatch.setattr(bounds, "_ACTIVE", [launch])
    builder.create_masked_load("p", "m", "o", cache_modifier=None, eviction_policy=None, is_volatile=False)  # 3.6's descriptor load
    builder.create_masked_load("p", "m", "o", 1, 2, True)
    builder.create_masked_store("p", "v", "m", None, None)
    builder.create_atomic_rmw("add", "p", "v", "m", "sem", "scope")
    builder.create_atomic_cas("p", "c", "v", "sem", "scope")
    assert launch.checked == ["load from", "load from", "store to", "atomic on", "atomic on"]
    assert builder.calls == [("load", None, None, False), ("load", 1, 2, True), ("store", None, None), ("rmw",), ("cas",)]

    class Renamed(_Triton36Methods):
        def create_masked_store(self, ptrs, value, mask, policy):
            pass

    monkeypatch.setattr(interpreter, "InterpreterBuilder", Renamed)
    monkeypatch.setattr(bounds, "_INSTALLED", [])
    with pytest.raises(RuntimeError, match="create_masked_store has an unexpected signature"):
        bounds.install()
