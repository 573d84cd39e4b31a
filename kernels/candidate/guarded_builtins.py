"""The builtins a candidate module runs with, in the sandbox and in the engine alike.

`candidate_builtins()`: `__import__` limited to the allowlist and the escape hatches (open, eval,
exec, ...) refused. Every refused attempt is appended to VIOLATIONS (the sandbox reads it after each
call) and raised as `SandboxViolation`. Two modules are stand-ins: `logging` is inert (nothing is
written, in the judge or the engine), and `functools`' caches (lru_cache, cache, cached_property)
refuse to keep a result that holds a tensor (an output buffer handed out again later), freeze the
results they keep (kernels/candidate/runtime_purity.py) and have no cache_info/cache_clear (a call
counter).
"""

from __future__ import annotations

import builtins
from typing import Any

from kernelloop.kernels.candidate.static_check import ALLOWED_IMPORTS, FORBIDDEN_NAMES

VIOLATIONS: list[str] = []  # every blocked attempt, in order


class SandboxViolation(PermissionError):
    pass


def violation(message: str) -> SandboxViolation:
    VIOLATIONS.append(message)
    return SandboxViolation(f"kernelloop sandbox: {message}")


def candidate_builtins() -> dict[str, Any]:
    """Builtins for the candidate's module: imports limited to the allowlist, escape hatches refused."""
    real_import = builtins.__import__

    def guarded_import(name: str, globals=None, locals=None, fromlist=(), level=0):  # noqa: A002
        if level or name.split(".")[0] not in ALLOWED_IMPORTS:
            raise violation(f"import of {name!r} is not allowed")
        if name.split(".")[0] in STAND_INS:  # a submodule (logging.handlers) would bind the real package
            if name not in STAND_INS:
                raise violation(f"import of {name!r} is not allowed")
            return STAND_INS[name]
        return real_import(name, globals, locals, fromlist, level)

    def refused(name: str):
        def call(*args: Any, **kwargs: Any) -> Any:
            raise violation(f"{name}() is not allowed")
        return call

    table = dict(vars(builtins))
    table["__import__"] = guarded_import
    for name in FORBIDDEN_NAMES - {"SystemExit", "__import__"}:
        if name in table:
            table[name] = refused(name)
    return table


class _InertLogger:
    """What `logging.getLogger(...)` gives a candidate: every call accepted, nothing written."""

    level = 0
    handlers: list = []

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return lambda *args, **kwargs: None

    def isEnabledFor(self, level: int) -> bool:  # noqa: N802 (logging's name)
        return False

    def getChild(self, suffix: str) -> "_InertLogger":  # noqa: N802
        return self


def _inert_logging() -> Any:
    import types

    module = types.ModuleType("logging", "An inert stand-in: candidates may log, nothing is written.")
    for i, name in enumerate(("NOTSET", "DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")):
        setattr(module, name, i * 10)
    module.WARN, module.FATAL = 30, 50
    logger = _InertLogger()
    module.getLogger = lambda name=None: logger
    module.Logger = module.Handler = module.NullHandler = module.StreamHandler = _InertLogger
    for name in ("basicConfig", "debug", "info", "warning", "warn", "error", "exception", "critical", "log",
                 "disable", "captureWarnings"):
        setattr(module, name, lambda *args, **kwargs: None)
    return module


INERT_LOGGING = _inert_logging()


def _cacheable(result: Any, fn: Any) -> Any:
    """A result a cache may keep: no tensor in it (refused), frozen containers."""
    import torch

    from kernelloop.kernels.candidate.loader import MODULE_NAME
    from kernelloop.kernels.candidate.runtime_purity import IMPURE, ImpureModule, frozen, walk_values

    if any(isinstance(v, torch.Tensor) for v in walk_values(result, MODULE_NAME)):
        raise ImpureModule(f"{IMPURE}{getattr(fn, '__name__', 'a cached function')} returned a tensor to a cache (a buffer "
                           "handed out again on a later call; kernels must be pure)")
    return frozen(result, f"the result of {getattr(fn, '__name__', '?')}", MODULE_NAME)


def _guarded_functools() -> Any:
    import functools
    import types

    module = types.ModuleType("functools", "functools, with caches that never keep a tensor.")
    for name in dir(functools):
        if not name.startswith("_"):
            setattr(module, name, getattr(functools, name))

    def cached(fn: Any, maxsize: int | None, typed: bool) -> Any:
        def checked(*args: Any, **kwargs: Any) -> Any:
            return _cacheable(fn(*args, **kwargs), fn)

        store = functools.lru_cache(maxsize=maxsize, typed=typed)(checked)

        def call(*args: Any, **kwargs: Any) -> Any:  # no cache_info / cache_clear: they count calls
            return store(*args, **kwargs)

        return functools.update_wrapper(call, fn)

    def lru_cache(maxsize: Any = 128, typed: bool = False) -> Any:
        if callable(maxsize) and not isinstance(maxsize, bool):  # @lru_cache with no arguments
            return cached(maxsize, 128, typed)
        return lambda fn: cached(fn, maxsize, typed)

    class cached_property(functools.cached_property):  # noqa: N801 (functools' name)
        def __get__(self, instance: Any, owner: Any = None) -> Any:
            value = super().__get__(instance, owner)
            if instance is not None:
                try:
                    value = vars(instance)[self.attrname] = _cacheable(value, self.func)
                except Exception:
                    vars(instance).pop(self.attrname, None)
                    raise
            return value

    module.lru_cache = lru_cache
    module.cache = lambda fn: cached(fn, None, False)
    module.cached_property = cached_property
    return module


STAND_INS = {"logging": INERT_LOGGING, "functools": _guarded_functools()}
