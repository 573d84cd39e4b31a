"""A serving engine and its registry: what it serves is what the registry's commits hold.

Issue #14: `agent registry rollback` left a running engine on the rolled-back kernel; a hand edit
left uncommitted (a kernel returning zeros, with its manifest hash) was served.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from kernelloop.engine.engine import Engine, EngineConfig
from kernelloop.kernels.registry import ANY_BUCKET, Registry
from kernelloop.kernels.registry.entry import sha256_text

from tests.hf_checkpoints import make_checkpoint
from tests.serving import serve
from tests.test_registry import RMSNORM_SOURCE, add

ROOT = Path(__file__).parents[1]
ZEROS = "import torch\n\n\ndef forward(x, weight, eps):\n    return torch.zeros_like(x)\n"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return make_checkpoint(tmp_path_factory.mktemp("reg-engine") / "ckpt", "gqa")


def _complete(base: str) -> list[int]:
    reply = httpx.post(f"{base}/v1/completions", json={"model": "tiny", "prompt": [5, 6, 7], "max_tokens": 4,
                                                       "temperature": 0, "logprobs": 1}, timeout=120).json()
    return reply["choices"][0]["logprobs"]["tokens"]


def test_rollback_with_engine_reloads_it_and_hand_edits_are_not_served(tmp_path: Path, model_dir: Path) -> None:
    registry = Registry(tmp_path / "reg")
    entry = add(registry, bucket=ANY_BUCKET)
    engine = Engine(EngineConfig(model=str(model_dir), kernels="registry", registry=str(registry.path)))
    with serve(engine, "tiny") as (base, loop):
        first = _complete(base)
        assert f"registry:{entry.id}" in loop.engine.kernels.variants_in_use()["rmsnorm"].values()

        # A hand edit: the source returns zeros and the manifest carries its hash; nobody commits it.
        manifest = registry.manifest_path.read_text()
        (registry.path / entry.source_path).write_text(ZEROS)
        registry.manifest_path.write_text(manifest.replace(entry.sha256, sha256_text(ZEROS)))
        reply = httpx.post(f"{base}/kernels/reload", timeout=60).json()
        assert reply["changed"] == {} and _complete(base) == first

        registry.manifest_path.write_text(manifest)  # the owner puts it back
        (registry.path / entry.source_path).write_text(RMSNORM_SOURCE)
        bad = httpx.post(f"{base}/kernels/reload", json={"revision": "no-such"}, timeout=60)
        assert bad.status_code == 400 and "not a commit" in bad.json()["error"]["message"]

        result = subprocess.run([sys.executable, "-m", "kernelloop.agent.cli", "registry", "rollback", entry.id, "--registry",
                                 str(registry.path), "--engine", base], cwd=ROOT, capture_output=True, text=True,
                                timeout=300)
        assert result.returncode == 0, result.stderr
        assert f"reloaded {base}: rmsnorm" in result.stdout and f"registry:{entry.id} -> baseline" in result.stdout
        assert set(loop.engine.kernels.variants_in_use()["rmsnorm"].values()) == {"baseline"}
