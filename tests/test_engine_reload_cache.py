"""A kernel reload that changes what is served invalidates the prefix cache (engine/radix_cache.py
`invalidate`): KV computed by the kernels replaced is never reused. Without it, the gate's measurement
after a commit reused the prompts' KV from its measurement before (testing decode only), and a rolled-back
kernel kept serving its KV for every cached prefix."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernelloop.engine.engine import Engine, EngineConfig
from kernelloop.engine.sampling import SamplingParams
from kernelloop.kernels.registry import ANY_BUCKET, Registry

from tests.hf_checkpoints import make_checkpoint
from tests.test_registry import RMSNORM_SOURCE, add

PROMPT = [[5, 6, 7, 8, 9, 10, 11, 12, 13, 14]]
GREEDY = SamplingParams(max_tokens=4, temperature=0.0)
# A different but honest-looking norm: every output scaled (what a changed kernel does to the numbers).
SCALED = RMSNORM_SOURCE.replace("    y = x * rstd * w\n", "    y = x * rstd * w * 3.0\n")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return make_checkpoint(tmp_path_factory.mktemp("reload-cache") / "ckpt", "gqa")


def _fresh(model_dir: Path, registry: Registry) -> list[int]:
    engine = Engine(EngineConfig(model=str(model_dir), kernels="registry", registry=str(registry.path)))
    return list(engine.generate(PROMPT, GREEDY)[0].output_ids)


def test_a_reload_recomputes_cached_prompts_with_the_new_kernels(tmp_path: Path, model_dir: Path) -> None:
    assert SCALED != RMSNORM_SOURCE
    registry = Registry(tmp_path / "reg")
    engine = Engine(EngineConfig(model=str(model_dir), kernels="registry", registry=str(registry.path)))
    before = list(engine.generate(PROMPT, GREEDY)[0].output_ids)
    assert engine.cache.total_size() > 0

    entry = add(registry, SCALED, bucket=ANY_BUCKET)
    assert engine.reload_kernels()["rmsnorm"]  # the scaled kernel now serves every rmsnorm shape seen
    hits = engine.cache.hit_tokens
    after = list(engine.generate(PROMPT, GREEDY)[0].output_ids)
    assert engine.cache.hit_tokens == hits  # nothing of the prompt came from the cache
    assert after == _fresh(model_dir, registry) and after != before

    registry.rollback(entry.id)
    assert engine.reload_kernels()["rmsnorm"]
    assert list(engine.generate(PROMPT, GREEDY)[0].output_ids) == before  # none of the scaled kernel's KV left


def test_a_reload_that_changes_nothing_keeps_the_cache(tmp_path: Path, model_dir: Path) -> None:
    engine = Engine(EngineConfig(model=str(model_dir), kernels="registry", registry=str(tmp_path / "reg")))
    engine.generate(PROMPT, GREEDY)
    assert engine.reload_kernels() == {}
    hits = engine.cache.hit_tokens
    engine.generate(PROMPT, GREEDY)
    assert engine.cache.hit_tokens - hits == len(PROMPT[0]) - 1
