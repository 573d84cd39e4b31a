"""One loader (kernels/candidate/loader.py) for the judge's runner and the engine's registry: a kernel
cannot tell which world it was loaded in, and a registry entry loads exactly as the runner loads it."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest
import torch

from kernelloop.kernels.candidate import loader as candidate_loader
from kernelloop.kernels.candidate.guarded_builtins import STAND_INS, SandboxViolation
from kernelloop.kernels.candidate.loader import MODULE_NAME, LoadError, load_kernel
from kernelloop.kernels.compare import check_impl
from kernelloop.kernels.ops import get_op
from kernelloop.kernels.registry.entry import Provenance
from kernelloop.sandbox.inside.worker import load_module

REPO = Path(__file__).resolve().parents[1]
CANDIDATES = REPO / "tests" / "sandbox_candidates"
HONEST = (CANDIDATES / "control_rmsnorm_row.py").read_text()
# What a module can see of its world at import, as a constant the runner reports (a plain string).
PROBE = HONEST.replace("import torch\n", '''import functools
import logging

import torch
''', 1) + '''

@functools.lru_cache(maxsize=None)
def _same(n: int) -> int:
    return n


WORLD = "|".join([__name__, str(logging.getLogger("x").isEnabledFor(50)), str(hasattr(logging, "root")),
                  str(hasattr(_same, "cache_info"))])
'''


class Spy:
    """Wraps load_kernel and keeps what it loaded."""

    def __init__(self) -> None:
        self.loaded: list = []

    def __call__(self, *args, **kwargs):  # noqa: ANN002, ANN003, ANN204
        result = load_kernel(*args, **kwargs)
        self.loaded.append(result)
        return result


def test_a_registry_entry_is_loaded_exactly_as_the_runner_loads_it(registry, monkeypatch) -> None:
    spy = Spy()
    monkeypatch.setattr(candidate_loader, "load_kernel", spy)
    monkeypatch.setattr("kernelloop.kernels.registry.loader.load_kernel", spy)
    _, constants = load_module(PROBE, "probe.py")  # the runner's way
    entry = registry.add("rmsnorm", PROBE, device="cpu-interpreter", dtype="float32", bucket="*", speedup=2.0,
                         speedup_ci=(1.5, 2.5), provenance=Provenance("search")).entry
    assert registry.load(entry) is not None  # the engine's way
    judged, served = spy.loaded
    assert constants["WORLD"] == judged.namespace["WORLD"] == served.namespace["WORLD"]
    assert constants["WORLD"] == "kernelloop_kernel|False|False|False"  # inert logging, no cache counters
    for name in ("__name__", "__file__"):
        assert judged.namespace[name] == served.namespace[name]
    assert judged.namespace["__file__"] == judged.canonical.label
    assert judged.namespace["logging"] is served.namespace["logging"] is STAND_INS["logging"]  # inert in both
    assert judged.namespace["functools"] is served.namespace["functools"] is STAND_INS["functools"]
    for loaded in (judged, served):
        guarded = loaded.namespace["__builtins__"]
        assert type(guarded) is dict and guarded["__import__"].__name__ == "guarded_import"
        with pytest.raises(SandboxViolation):
            guarded["__import__"]("os")
        with pytest.raises(SandboxViolation):
            guarded["open"]("/etc/hostname")
    assert MODULE_NAME not in sys.modules  # only while executing: several kernels never collide


def test_an_entry_refused_by_todays_checks_or_importing_outside_the_allowlist_is_not_served(registry, caplog) -> None:
    """The engine runs the static check too, and the guarded builtins hold without it."""
    escapes = HONEST.replace("import torch\n", "import torch\nimport os\n", 1)
    entry = registry.add("rmsnorm", escapes, device="cpu-interpreter", dtype="float32", bucket="*", speedup=2.0,
                         speedup_ci=(1.5, 2.5), provenance=Provenance("search")).entry
    with caplog.at_level(logging.ERROR):
        assert registry.load(entry) is None
    assert "static check" in caplog.text and "'os'" in caplog.text
    with pytest.raises(SandboxViolation, match="'os'"):
        load_kernel(escapes, static=False)
    with pytest.raises(SandboxViolation, match="logging.handlers"):
        load_kernel(HONEST.replace("import torch\n", "import torch\nimport logging.handlers\n", 1), static=False)
    with pytest.raises(LoadError, match="signature|positional"):
        load_kernel(HONEST, get_op("silu_mul").arg_names)


def test_two_kernels_with_dataclasses_load_side_by_side() -> None:
    with_dataclass = HONEST.replace("import torch\n", "from dataclasses import dataclass\n\nimport torch\n", 1) + '''

@dataclass(frozen=True)
class Config:
    warps: int = 4


CONFIG = Config()
'''
    first = load_kernel(with_dataclass)
    second = load_kernel(with_dataclass.replace("warps: int = 4", "warps: int = 8"))
    assert first.namespace["CONFIG"].warps == 4 and second.namespace["CONFIG"].warps == 8
    assert MODULE_NAME not in sys.modules
    spec = get_op("rmsnorm")
    for loaded in (first, second):
        assert check_impl(spec, loaded.forward, spec.test_shapes[0], torch.float32, 0).ok


@pytest.mark.parametrize("path", sorted(REPO.glob("kernels/ops/*_kernel.py")) + sorted(CANDIDATES.glob("control_*.py")),
                         ids=lambda p: p.stem)
def test_every_baseline_and_control_loads_as_a_registry_entry_and_serves(path: Path) -> None:
    source = path.read_text()
    op = next((line.split(":")[1].strip() for line in source.splitlines() if line.startswith("# op:")), None)
    op = op or (path.stem.removesuffix("_kernel") if path.parent.name == "ops" else "rmsnorm")
    spec = get_op(op)
    loaded = load_kernel(source, spec.arg_names)  # with the static check, as the engine loads
    for seed in (0, 1):  # a second call: the purity check after each call holds for honest code
        result = check_impl(spec, loaded.forward, spec.test_shapes[0], torch.float32, seed)
        assert result.ok, result
