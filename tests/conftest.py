"""Shared test setup: Triton's mode is fixed before any kernel module is imported.

The suite is CPU-first: unless KERNELLOOP_GPU_TESTS=1 (set by bench/gpu_check.sh, which runs only
the `gpu`-marked tests), Triton runs through its interpreter even on a GPU machine, because the
CPU tests hand it CPU tensors. GPU tests are skipped whenever kernels are interpreted.
"""

from __future__ import annotations

import os

if os.environ.get("KERNELLOOP_GPU_TESTS") != "1":
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

import kernelloop.kernels.ops  # noqa: E402,F401  (configures Triton)
from kernelloop.kernels.device import default_device  # noqa: E402


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not default_device().interpreted:
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (run bench/gpu_check.sh on a GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    # A selection that matches no test (e.g. `-m gpu` on a tree without GPU tests yet) is not a failure.
    if exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED:
        session.exitstatus = pytest.ExitCode.OK


@pytest.fixture(scope="session")
def embedded_model_dir(tmp_path_factory):
    """The embedded default model, built once per test session into a temporary cache root."""
    from kernelloop.engine.embedded import ensure_embedded_model

    return ensure_embedded_model(tmp_path_factory.mktemp("kernelloop-cache"))


@pytest.fixture
def registry(tmp_path):
    from kernelloop.kernels.registry import Registry

    return Registry(tmp_path / "registry")


@pytest.fixture(scope="session")
def helper():
    """One confinement helper process (tests/confine_harness.py) for the tests/test_sandbox_confine*.py files."""
    from tests.confine_harness import Helper

    h = Helper()
    yield h
    h.close()


@pytest.fixture(scope="session")
def ptxas() -> str:
    """Triton's bundled ptxas for sm90."""
    from triton.backends.nvidia.compiler import get_ptxas

    return get_ptxas(90).path
