"""The builtins a candidate module runs with, in the sandbox and in the engine alike.

`candidate_builtins()`: `__import__` limited to the allowlist (`logging` is an inert stand-in) and
the escape hatches (open, eval, exec, ...) refused. Every refused attempt is appended to VIOLATIONS
(the sandbox reads it after each call) and raised as `SandboxViolation`.
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
        if name == "logging":
            return INERT_LOGGING
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
