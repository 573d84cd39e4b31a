"""The engine's embedded default model: a small Llama generated reproducibly on first use.

With no `--model`, the engine serves this model. `ensure_embedded_model()` returns its Hugging Face
format directory, building it first (about 40 s on 2 idle CPU cores) when the cache lacks a valid copy:

    corpus (templated stories, facts, chat dialogues) -> byte-level BPE tokenizer
    -> seeded training of a 3-layer Llama -> config.json, model.safetensors, tokenizer files

The cache directory is `<cache root>/models/embedded-v<RECIPE_VERSION>`; the cache root is the
argument, else `$KERNELLOOP_CACHE`, else `~/.cache/kernelloop`. A build happens in a temporary
sibling directory that is renamed into place once complete; a marker file written last holds the
sha256 of every file, and a directory whose marker is missing or disagrees is rebuilt. Builders
take an exclusive lock on a file next to the directory, so concurrent processes build once.

Change RECIPE_VERSION whenever anything that changes the files changes.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kernelloop import IMPORT_ROOT
from kernelloop.common.paths import cache_root
from kernelloop.engine.errors import ModelLoadError
from kernelloop.engine.gguf_fetch import sha256_file
from kernelloop.engine.tokenizer import render_chat_template

from .bpe import BOS, CHAT_TEMPLATE, EOS, train_tokenizer
from .corpus import Document, generate_corpus
from .export import export
from .model import ModelConfig
from .train import TRAIN_THREADS, TrainConfig, pack, train_model

__all__ = ["ensure_embedded_model", "build_embedded_model", "build_in_subprocess", "default_cache_root",
           "verify", "render_document", "RECIPE_VERSION", "MARKER"]

RECIPE_VERSION = 1
MARKER = "kernelloop-embedded.json"
CORPUS_SEED = 20240601
N_DOCS = 12000
VOCAB_SIZE = 1536


def default_cache_root() -> Path:
    """$KERNELLOOP_CACHE, else ~/.cache/kernelloop."""
    return cache_root()


def verify(model_dir: Path) -> bool:
    """True when `model_dir` holds a complete build of this recipe (marker present, hashes match)."""
    try:
        marker = json.loads((model_dir / MARKER).read_text(encoding="utf-8"))
        files = marker["files"]
        if marker.get("recipe_version") != RECIPE_VERSION or not files:
            return False
        return all(sha256_file(model_dir / name) == digest for name, digest in files.items())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def _say(msg: str) -> None:
    print(f"kernelloop embedded model: {msg}", file=sys.stderr, flush=True)


def build_embedded_model(out_dir: Path, steps: int | None = None) -> dict:
    """Generate the model into the existing empty directory `out_dir`; returns build facts.

    `steps` shortens training (tests only: a different step count is a different model).
    """
    if not out_dir.is_dir():
        raise FileNotFoundError(f"{out_dir} is not a directory")
    start = time.monotonic()
    docs = generate_corpus(N_DOCS, CORPUS_SEED)
    texts = [render_document(d) for d in docs]
    tok = train_tokenizer(texts, VOCAB_SIZE)
    _say(f"corpus of {len(docs)} documents, tokenizer of {tok.get_vocab_size()} tokens "
         f"({time.monotonic() - start:.1f} s)")
    ids = [tok.encode(text, add_special_tokens=False).ids for text in texts]
    tc = TrainConfig() if steps is None else dataclasses.replace(TrainConfig(), steps=steps)
    data = pack(ids, tc.seq_len, pad_id=tok.token_to_id(EOS))
    cfg = ModelConfig(vocab_size=tok.get_vocab_size())
    _say(f"training {tc.steps} steps of {tc.batch_size} x {tc.seq_len} tokens")
    params, final_loss = train_model(cfg, tc, data)
    if not math.isfinite(final_loss):
        raise ModelLoadError(f"embedded model training diverged (loss {final_loss})")
    export(out_dir, cfg, params, tok)
    seconds = time.monotonic() - start
    _say(f"done in {seconds:.1f} s, final loss {final_loss:.3f}")
    return {"final_loss": round(final_loss, 4), "build_seconds": round(seconds, 1)}


def render_document(doc: Document) -> str:
    """A corpus document as training text: BOS text EOS, or the chat template's rendering."""
    if doc.messages:
        return render_chat_template(CHAT_TEMPLATE, list(doc.messages), add_generation_prompt=False,
                                    bos_token=BOS)
    return f"{BOS}{doc.text}{EOS}"


def build_in_subprocess(out_dir: Path) -> dict:
    """`build_embedded_model(out_dir)` in a fresh Python process; returns its build facts.

    A fresh process gives every build the same state (threads, loaded libraries) and leaves the
    caller's torch settings alone. OpenMP workers spin only briefly before sleeping, so a build
    on cores that are busy with other work slows down a few times, not tens of times.
    """
    env = {**os.environ, "OMP_NUM_THREADS": str(TRAIN_THREADS), "MKL_NUM_THREADS": str(TRAIN_THREADS),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(IMPORT_ROOT), os.environ.get("PYTHONPATH")]))}
    env.setdefault("GOMP_SPINCOUNT", "10000")
    proc = subprocess.run([sys.executable, "-m", "kernelloop.engine.embedded", "--build-into", str(out_dir)],
                          env=env, stdout=subprocess.PIPE, text=True)  # progress: stderr, as is
    if proc.returncode != 0:
        raise ModelLoadError(f"building the embedded model failed (exit status {proc.returncode}); "
                             "its output is above")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _write_marker(model_dir: Path, facts: dict) -> None:
    files = {p.name: sha256_file(p) for p in sorted(model_dir.iterdir()) if p.is_file()}
    marker = {"recipe_version": RECIPE_VERSION, "files": files, **facts}
    tmp = model_dir / (MARKER + ".tmp")
    tmp.write_text(json.dumps(marker, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    with tmp.open("rb") as f:
        os.fsync(f.fileno())
    os.rename(tmp, model_dir / MARKER)


def ensure_embedded_model(cache_dir: Path | None = None) -> Path:
    """The embedded model's directory under the cache root `cache_dir`, built if not valid there."""
    root = Path(cache_dir) if cache_dir is not None else default_cache_root()
    target = root / "models" / f"embedded-v{RECIPE_VERSION}"
    if verify(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f"{target.name}.lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if verify(target):  # another process built it while we waited
            return target
        print(f"kernelloop embedded model: building into {target} (first use)", file=sys.stderr)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
        os.chmod(tmp, 0o755)  # mkdtemp makes it private; the cache is readable like any other
        try:
            facts = build_in_subprocess(tmp)
            _write_marker(tmp, facts)
            if target.exists():  # half-written or stale: move aside, then delete
                stale = Path(tempfile.mkdtemp(prefix=f".{target.name}.stale-", dir=target.parent))
                os.rename(target, stale / "old")
                shutil.rmtree(stale, ignore_errors=True)
            os.rename(tmp, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target
