"""engine/cpu_allocator.py: a long prefill's buffers are reused between layers instead of faulted in."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

# Page faults per 320-token prefill of the embedded model (reference path), with the engine's
# allocator settings or with glibc's defaults (the setting is per process: one process each).
PROBE = """
import resource, sys
import kernelloop.engine.engine as em
if sys.argv[1] == "off":
    em.keep_freed_memory = lambda: False
from kernelloop.engine.sampling import SamplingParams
eng = em.Engine(em.EngineConfig(prefix_cache=False))
ids = eng.tokenizer.encode("You are a coding agent working in a large Python repository. " * 40)[:320]
params = SamplingParams(max_tokens=1, temperature=0)
eng.generate([ids], params)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(3):
    eng.generate([ids], params)
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) // 3)
"""


def _faults_per_prefill(mode: str) -> int:
    run = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    return int(run.stdout.split()[-1])


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's mallopt")
def test_a_long_prefill_reuses_its_buffers_instead_of_faulting_pages_in():
    default, kept = _faults_per_prefill("off"), _faults_per_prefill("on")
    assert default > 1000  # MBs of fresh pages per prefill with glibc's defaults (measured ~4700)
    assert kept < default // 10  # measured 0


def test_the_cpu_engine_applies_it(monkeypatch):
    import kernelloop.engine.engine as engine_module

    calls = []
    monkeypatch.setattr(engine_module, "keep_freed_memory", lambda: calls.append(1) or True)
    engine_module.Engine(engine_module.EngineConfig())
    assert calls == [1]
