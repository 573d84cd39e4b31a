"""The kernel registry: add, select, load, integrity, rollback, corruption, concurrency."""

from __future__ import annotations

import logging
import multiprocessing
from pathlib import Path

import git
import pytest
import torch

from kernelloop.common.errors import RegistryError
from kernelloop.kernels import get_op
from kernelloop.kernels.registry import ANY_BUCKET, Provenance, Registry
from kernelloop.kernels.registry.entry import sha256_text

from tests.registry_support import commit_by_hand

RMSNORM_SOURCE = Path(get_op("rmsnorm").forward.__code__.co_filename).read_text()
DEVICE = "cpu-interpreter"


def add(reg: Registry, source: str = RMSNORM_SOURCE, *, bucket: str = ANY_BUCKET, dtype: str = "float32",
        device: str = DEVICE, speedup: float = 1.25):
    return reg.add("rmsnorm", source, device=device, dtype=dtype, bucket=bucket, speedup=speedup,
                   speedup_ci=(speedup - 0.05, speedup + 0.05),
                   provenance=Provenance("search", model=None, prompt_hash="abc", history_id=7)).entry


def commits(reg: Registry) -> list[str]:
    return [c.message.splitlines()[0] for c in reg.history()]


def test_empty_or_absent_registry_has_no_entries(tmp_path):
    assert Registry(tmp_path / "nowhere").entries() == []
    assert Registry(tmp_path / "nowhere").select("rmsnorm", DEVICE, "float32", "hidden=64,tokens=1") is None


def test_add_is_one_commit_naming_op_device_and_speedup(registry):
    entry = add(registry)
    entry2 = add(registry, RMSNORM_SOURCE + "\n# another variant\n", dtype="bfloat16", speedup=1.5)
    log = commits(registry)
    assert len(log) == 3  # initialisation + one per add
    assert "rmsnorm" in log[0] and DEVICE in log[0] and "1.50x" in log[0]
    assert {e.id for e in registry.entries()} == {entry.id, entry2.id}
    stored = registry.entries()[0]
    assert stored.provenance == Provenance("search", None, "abc", 7)
    assert len(stored.sha256) == 64 and stored.verified_at
    assert not git.Repo(registry.path).is_dirty(untracked_files=True)


def test_add_replaces_the_entry_for_the_same_key(registry):
    add(registry, speedup=1.1)
    newer = add(registry, RMSNORM_SOURCE + "\n# v2\n", speedup=1.3)
    assert [e.id for e in registry.entries()] == [newer.id]


def test_select_prefers_exact_bucket_then_wildcard_then_baseline(registry):
    wildcard = add(registry)
    exact = add(registry, RMSNORM_SOURCE + "\n# decode\n", bucket="hidden=4096,tokens=1")
    assert registry.select("rmsnorm", DEVICE, "float32", "hidden=4096,tokens=1") == exact
    assert registry.select("rmsnorm", DEVICE, "float32", "hidden=4096,tokens=17-128") == wildcard
    assert registry.select("rmsnorm", DEVICE, "bfloat16", "hidden=4096,tokens=1") is None
    # Interpreter measurements never select GPU kernels, and the other way round.
    assert registry.select("rmsnorm", "NVIDIA H200 sm90", "float32", "hidden=4096,tokens=1") is None


def test_load_runs_the_stored_kernel(registry):
    spec = get_op("rmsnorm")
    forward = registry.load(add(registry))
    args = spec.make_inputs({"tokens": 3, "hidden": 33}, torch.float32, 0, "cpu")
    torch.testing.assert_close(forward(*args), spec.reference(*args))


def test_a_tampered_committed_source_is_refused_and_logged(registry, caplog):
    entry = add(registry)
    (registry.path / entry.source_path).write_text(RMSNORM_SOURCE.replace("rsqrt", "sqrt"))
    commit_by_hand(registry)
    with caplog.at_level(logging.ERROR):
        assert registry.load(entry) is None
    assert "does not match" in caplog.text


def test_an_uncommitted_hand_edit_is_never_served_and_blocks_writes(registry):
    """A source changed together with its manifest hash and left uncommitted is not served, and blocks writes."""
    entry = add(registry)
    zeros = "import torch\n\ndef forward(x, weight, eps):\n    return torch.zeros_like(x)\n"
    tampered = registry.manifest_path.read_text().replace(entry.sha256, sha256_text(zeros))
    (registry.path / entry.source_path).write_text(zeros)
    registry.manifest_path.write_text(tampered)
    assert registry.uncommitted() == sorted(["manifest.json", entry.source_path])
    assert registry.entries() == [entry] and registry.source(entry) == RMSNORM_SOURCE  # HEAD, not the files
    spec = get_op("rmsnorm")
    args = spec.make_inputs({"tokens": 3, "hidden": 33}, torch.float32, 0, "cpu")
    torch.testing.assert_close(registry.load(entry)(*args), spec.reference(*args))
    with pytest.raises(RegistryError, match="uncommitted changes .*nothing was written"):
        add(registry, dtype="float16")
    with pytest.raises(RegistryError, match="uncommitted changes"):
        registry.rollback(entry.id)
    assert registry.manifest_path.read_text() == tampered  # the hand edit is left for its owner


def test_missing_or_broken_source_is_refused_not_raised(registry):
    entry = add(registry)
    (registry.path / entry.source_path).unlink()
    commit_by_hand(registry, "delete a source")
    assert registry.load(entry) is None
    broken = add(registry, "def forward(:\n", dtype="float16")
    assert registry.load(broken) is None


def test_the_registry_is_read_at_any_commit(registry):
    entry = add(registry)
    assert registry.entries("HEAD~1") == [] and registry.entries() == [entry]
    assert registry.added_by(entry).sha == registry.head()


def test_add_returns_the_commit_it_made(registry):
    # Issue #15: the loop found a new entry's commit by searching the log; add says it.
    first = registry.add("rmsnorm", RMSNORM_SOURCE, device=DEVICE, dtype="float32", bucket=ANY_BUCKET, speedup=1.2,
                         speedup_ci=(1.1, 1.3), provenance=Provenance("search"))
    second = registry.add("silu_mul", RMSNORM_SOURCE + "\n# another\n", device=DEVICE, dtype="float32",
                          bucket=ANY_BUCKET, speedup=1.2, speedup_ci=(1.1, 1.3), provenance=Provenance("search"))
    assert second.commit == registry.head() != first.commit
    assert registry.added_by(first.entry).sha == first.commit and registry.entries(f"{second.commit}^") == [first.entry]
    with pytest.raises(RegistryError, match="not a commit"):
        registry.entries("no-such-commit")


def test_rollback_is_a_revert_commit(registry):
    first = add(registry, speedup=1.1)
    second = add(registry, RMSNORM_SOURCE + "\n# v2\n", speedup=1.3)
    before = [c.sha for c in registry.history()]
    registry.rollback(second.id)
    assert [e.id for e in registry.entries()] == [first.id]
    after = registry.history()
    assert [c.sha for c in after[1:]] == before, "history must not be rewritten"
    assert after[0].message.startswith('Revert "Add rmsnorm') and f"reverts commit {before[0]}" in after[0].message
    registry.rollback(first.id)
    assert registry.entries() == []


def test_rollback_by_commit_and_refusals(registry):
    add(registry, speedup=1.1)
    head = registry.history()[0].sha
    add(registry, RMSNORM_SOURCE + "\n# v2\n", speedup=1.3)
    with pytest.raises(RegistryError, match="changed again since"):
        registry.rollback(head)
    with pytest.raises(RegistryError, match="neither an entry id nor a commit"):
        registry.rollback("no-such-thing")
    second = registry.entries()[0]
    registry.rollback(registry.history()[0].sha)
    with pytest.raises(RegistryError, match=f"entry {second.id} is not in the registry any more: already rolled back"):
        registry.rollback(second.id)
    with pytest.raises(RegistryError, match="no longer in .*Revert"):
        registry.find(second.id)
    with pytest.raises(RegistryError, match="first commit"):
        registry.rollback(registry.history()[-1].sha)


@pytest.mark.parametrize("text", ['{"format": 1, "entries": [', "", "[]", '{"format": 1, "entries": [{"op": 1}]}'])
def test_corrupt_manifest_is_one_clear_error(registry, text):
    add(registry)
    registry.manifest_path.write_text(text)
    commit_by_hand(registry, "a corrupt manifest")
    with pytest.raises(RegistryError) as info:
        registry.entries()
    assert "\n" not in str(info.value) and str(registry.manifest_path) in str(info.value)
    with pytest.raises(RegistryError):
        add(registry, speedup=2.0)  # no write on top of a manifest we cannot read


def test_a_directory_that_is_not_a_registry_is_refused(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(RegistryError, match="not a kernel registry"):
        Registry(tmp_path).entries()
    with pytest.raises(RegistryError, match="not empty"):
        add(Registry(tmp_path))
    assert (tmp_path / "notes.txt").read_text() == "hello"


def test_a_crash_mid_write_leaves_the_old_manifest(registry, monkeypatch):
    add(registry)
    old = registry.manifest_path.read_text()

    def crash(*_):
        raise OSError("disk full")

    monkeypatch.setattr("kernelloop.kernels.registry.manifest.os.replace", crash)
    with pytest.raises(OSError):
        add(registry, RMSNORM_SOURCE + "\n# v2\n")
    monkeypatch.undo()
    assert registry.manifest_path.read_text() == old
    assert not list(registry.path.glob(".manifest.json.*")), "temp file left behind"


def _add_many(path: str, dtype: str, n: int) -> None:
    reg = Registry(path)
    for i in range(n):
        add(reg, RMSNORM_SOURCE + f"\n# {dtype} {i}\n", dtype=dtype, bucket=f"hidden={i},tokens=1")


def test_concurrent_writers_lose_nothing(registry):
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_add_many, args=(str(registry.path), dt, 4)) for dt in ("float16", "bfloat16")]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    assert len(registry.entries()) == 8
    assert len(registry.history()) == 9  # one initialisation, eight adds
