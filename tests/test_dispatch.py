"""Dispatch: variant resolution, caching, fallback and hot reload."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from kernelloop.common.errors import RegistryError
from kernelloop.kernels import OPS, get_op
from kernelloop.kernels.device import CPU
from kernelloop.kernels.dispatch import Dispatcher
from kernelloop.kernels.registry import ANY_BUCKET

from tests.registry_support import commit_by_hand
from tests.test_registry import RMSNORM_SOURCE, add

SPEC = get_op("rmsnorm")
SHAPE = {"tokens": 3, "hidden": 33}
RAISING_SOURCE = "def forward(x, weight, eps):\n    raise RuntimeError('kernel exploded')\n"


def inputs(shape=SHAPE, dtype=torch.float32, seed=0):
    return SPEC.make_inputs(shape, dtype, seed, "cpu")


@pytest.mark.parametrize("mode,variant", [("reference", "reference"), ("baseline", "baseline"), ("registry", "baseline")])
def test_modes_pick_their_variant(registry, mode, variant):
    kd = Dispatcher(mode, registry=registry)
    args = inputs()
    torch.testing.assert_close(kd.rmsnorm(*args), SPEC.reference(*args))
    assert kd.variants_in_use()["rmsnorm"] == {"float32 hidden=33,tokens=2-16": variant}


def test_every_op_dispatches(registry):
    kd = Dispatcher("registry", registry=registry)
    for name, spec in OPS.items():
        args = spec.make_inputs(spec.test_shapes[0], torch.float32, 0, "cpu")
        out = kd(name, *args)
        ref = spec.reference(*args)
        for o, r in zip(out if isinstance(out, tuple) else (out,), ref if isinstance(ref, tuple) else (ref,)):
            torch.testing.assert_close(o, r)


def test_resolution_is_cached_per_size_class(registry):
    calls = []
    counting = dataclasses.replace(SPEC, shape_of=lambda *a: calls.append(1) or SPEC.shape_of(*a))
    kd = Dispatcher("baseline", registry=registry, ops={"rmsnorm": counting})
    for tokens in (5, 6, 7, 8, 5):  # one size class
        kd.rmsnorm(*inputs({"tokens": tokens, "hidden": 33}))
    assert len(calls) == 1
    kd.rmsnorm(*inputs({"tokens": 9, "hidden": 33}))  # next class, same bucket: resolved once more
    kd.rmsnorm(*inputs({"tokens": 1, "hidden": 33}))
    assert len(calls) == 3


def test_registry_entry_is_used_for_its_device_dtype_and_bucket(registry):
    entry = add(registry, RMSNORM_SOURCE + "\n# registered\n", bucket="hidden=33,tokens=2-16")
    kd = Dispatcher("registry", registry=registry)
    kd.rmsnorm(*inputs())
    kd.rmsnorm(*inputs({"tokens": 1, "hidden": 33}))
    kd.rmsnorm(*inputs(dtype=torch.float16))
    assert kd.variants_in_use()["rmsnorm"] == {
        "float32 hidden=33,tokens=2-16": f"registry:{entry.id}",
        "float32 hidden=33,tokens=1": "baseline",
        "float16 hidden=33,tokens=2-16": "baseline",
    }


def test_a_kernel_that_raises_falls_back_to_the_baseline(registry):
    add(registry, RAISING_SOURCE)
    kd = Dispatcher("registry", registry=registry)
    args = inputs()
    torch.testing.assert_close(kd.rmsnorm(*args), SPEC.reference(*args))
    assert kd.variants_in_use()["rmsnorm"] == {"float32 hidden=33,tokens=2-16": "baseline"}


ZEROS_SOURCE = "import torch\n\ndef forward(x, weight, eps):\n    return torch.zeros_like(x)\n"


def test_a_cpu_registry_kernel_never_gets_more_tokens_than_its_judge_checked(registry):
    """Past the CPU judge's range (1025 tokens) a call goes to the baseline; within it, to the entry."""
    add(registry, ZEROS_SOURCE, bucket=ANY_BUCKET)
    kd = Dispatcher("registry", registry=registry)
    limit = SPEC.judged_tokens(kd.device)
    within, past = inputs({"tokens": limit, "hidden": 4}), inputs({"tokens": limit + 1, "hidden": 4})
    assert kd.rmsnorm(*within).abs().max() == 0  # the entry served the largest judged call
    torch.testing.assert_close(kd.rmsnorm(*past), SPEC.reference(*past))  # same size class, past the range
    assert kd.variants_in_use()["rmsnorm"]["float32 hidden=4,tokens=1025-8192"].startswith("registry:")


def test_a_tampered_entry_is_not_loaded(registry):
    entry = add(registry)
    (registry.path / entry.source_path).write_text(RAISING_SOURCE)
    commit_by_hand(registry)
    kd = Dispatcher("registry", registry=registry)
    kd.rmsnorm(*inputs())
    assert kd.variants_in_use()["rmsnorm"] == {"float32 hidden=33,tokens=2-16": "baseline"}


def test_a_repaired_entry_is_picked_up_on_reload(registry):
    entry = add(registry)
    source = registry.path / entry.source_path
    source.write_text(RAISING_SOURCE)
    commit_by_hand(registry, "break it")
    kd = Dispatcher("registry", registry=registry)
    kd.rmsnorm(*inputs())
    source.write_text(RMSNORM_SOURCE)
    assert kd.reload() == {}  # not committed yet: not served
    commit_by_hand(registry, "repair it")
    assert kd.reload() == {"rmsnorm": {"float32 hidden=33,tokens=2-16": ("baseline", f"registry:{entry.id}")}}


def test_a_corrupt_registry_leaves_the_baselines_working(registry):
    add(registry)
    registry.manifest_path.write_text('{"format": 1, "entr')
    commit_by_hand(registry)
    kd = Dispatcher("registry", registry=registry)
    assert "corrupt" in kd.registry_error
    args = inputs()
    torch.testing.assert_close(kd.rmsnorm(*args), SPEC.reference(*args))
    assert kd.variants_in_use()["rmsnorm"] == {"float32 hidden=33,tokens=2-16": "baseline"}


def test_reload_picks_up_adds_and_rollbacks(registry):
    kd = Dispatcher("registry", registry=registry)
    kd.rmsnorm(*inputs())
    assert kd.reload() == {}
    entry = add(registry, RMSNORM_SOURCE + "\n# hot\n")
    assert kd.reload() == {"rmsnorm": {"float32 hidden=33,tokens=2-16": ("baseline", f"registry:{entry.id}")}}
    args = inputs(seed=4)
    torch.testing.assert_close(kd.rmsnorm(*args), SPEC.reference(*args))
    registry.rollback(entry.id)
    assert kd.reload() == {"rmsnorm": {"float32 hidden=33,tokens=2-16": (f"registry:{entry.id}", "baseline")}}


def test_reload_at_a_revision_pins_that_commit_until_the_next_plain_reload(registry):
    """The gate alternates the registry before and after a commit by reloading at each."""
    kd = Dispatcher("registry", registry=registry)
    kd.rmsnorm(*inputs())
    entry = add(registry)
    key = "float32 hidden=33,tokens=2-16"
    assert kd.reload("HEAD~1") == {} and kd.revision == "HEAD~1"
    assert kd.reload(registry.head()) == {"rmsnorm": {key: ("baseline", f"registry:{entry.id}")}}
    assert kd.reload("HEAD~1") == {"rmsnorm": {key: (f"registry:{entry.id}", "baseline")}}
    with pytest.raises(RegistryError, match="not a commit"):
        kd.reload("nope")
    assert kd.variants_in_use()["rmsnorm"] == {key: "baseline"}  # a failed reload changes nothing
    assert kd.reload() == {"rmsnorm": {key: ("baseline", f"registry:{entry.id}")}} and kd.revision is None


def test_entries_of_another_device_are_ignored(registry):
    add(registry, RAISING_SOURCE, device="NVIDIA H200 sm90", bucket=ANY_BUCKET)
    kd = Dispatcher("registry", registry=registry, device=CPU)
    kd.rmsnorm(*inputs())
    assert kd.variants_in_use()["rmsnorm"] == {"float32 hidden=33,tokens=2-16": "baseline"}


def test_unknown_mode_is_refused(registry):
    with pytest.raises(ValueError, match="unknown kernel mode"):
        Dispatcher("fastest", registry=registry)


def test_a_demotion_is_listed_until_the_next_reload(registry):
    # A kernel that raised and was demoted is listed (not only logged) until the next reload.
    entry = add(registry, RAISING_SOURCE)
    kd = Dispatcher("registry", registry=registry)
    kd.rmsnorm(*inputs())
    [demotion] = kd.demotions
    assert (demotion.op, demotion.where, demotion.variant, demotion.now) == (
        "rmsnorm", "float32 hidden=33,tokens=2-16", f"registry:{entry.id}", "baseline")
    assert demotion.error == "RuntimeError: kernel exploded"
    kd.reload()
    assert kd.demotions == []


def test_out_of_memory_is_not_the_kernels_fault(registry):
    # Out of memory is transient, not the kernel's fault: it propagates and demotes nothing.
    add(registry, "import torch\n\ndef forward(x, weight, eps):\n    raise torch.OutOfMemoryError('CUDA out of memory')\n")
    kd = Dispatcher("registry", registry=registry)
    with pytest.raises(torch.OutOfMemoryError):
        kd.rmsnorm(*inputs())
    assert kd.demotions == [] and kd.variants_in_use()["rmsnorm"]["float32 hidden=33,tokens=2-16"].startswith("registry:")


def test_metrics_show_demotions(registry):
    from types import SimpleNamespace

    from kernelloop.engine.metrics import render_metrics

    entry = add(registry, RAISING_SOURCE)
    kd = Dispatcher("registry", registry=registry)
    kd.rmsnorm(*inputs())
    engine = SimpleNamespace(kernels=kd, stats={"generated_tokens": 0, "prompt_tokens": 0, "forwards": 0},
                             scheduler=SimpleNamespace(running=[], waiting=[], chunked=None), kv_usage=lambda: 0.0,
                             cache=SimpleNamespace(hit_rate=0.0))
    text = render_metrics(SimpleNamespace(engine=engine, tokens_per_second=lambda: 0.0))
    assert (f'kernelloop_kernel_demoted{{op="rmsnorm",shape="float32 hidden=33,tokens=2-16",'
            f'variant="registry:{entry.id}",now="baseline"}} 1') in text
