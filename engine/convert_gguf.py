"""Converting a GGUF checkpoint once into a Hugging Face-format directory the engine serves.

`ensure_converted(model, cache_root)` returns `<cache root>/models/<model.cache_name>/`, converting
on first use: the GGUF (located and sha256-checked by engine.gguf_fetch) is dequantized to float32
by transformers, then written as config.json, generation_config.json, model.safetensors (tied
`lm_head.weight` left out) and the tokenizer files (tokenizer.json, tokenizer_config.json,
chat_template.jinja). The conversion happens in a temporary sibling directory, renamed into place
once complete, under an exclusive lock so that concurrent processes convert once.

The manifest (`kernelloop-manifest.json`, written last) records the source (package, version,
GGUF sha256), the size and sha256 of every file written, and the converter's versions.

Checking a cached directory on every start is deliberately cheap: the manifest must parse, be of
this CONVERT_FORMAT and name the expected source sha256, and every listed file must exist with
its recorded size; files under HASH_LIMIT bytes (config, tokenizer) are re-hashed too, while
model.safetensors (~540 MB, ~1-2 s to hash) is checked by size only (its header and tensor
shapes are then checked by the weight loader). `verify_converted(dir, model, full=True)`
re-hashes everything. A directory that fails the check is reported (one line: delete it to
convert again), never silently replaced; only a manifest of an older CONVERT_FORMAT is replaced
by a fresh conversion.
"""

from __future__ import annotations

import fcntl
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from kernelloop.engine.errors import ModelLoadError
from kernelloop.engine.gguf_fetch import WheelGguf, locate_gguf, sha256_file

CONVERT_FORMAT = 1  # bump whenever the written files change; older caches are then converted again
MANIFEST = "kernelloop-manifest.json"
HASH_LIMIT = 16 << 20
REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json")
CONVERT_DEPS = ("transformers", "gguf", "accelerate")
# GGUF `tokenizer.ggml.pre` values whose pre-tokenizer transformers' GGUF reader does not rebuild:
# llama.cpp's "smollm" splits every digit apart before the GPT-2 byte-level regex.
INDIVIDUAL_DIGITS_PRE = ("smollm", "starcoder", "refact", "codeshell")
# PretrainedConfig fields that say nothing about the model (and the GGUF quantization, now undone).
_CONFIG_NOISE = ("quantization_config", "id2label", "label2id", "chunk_size_feed_forward", "is_encoder_decoder",
                 "output_attentions", "output_hidden_states", "problem_type", "return_dict")


@dataclass(frozen=True)
class GgufModel:
    """A model served from a GGUF file: `cache_name` names its converted directory (change it
    whenever `source` changes)."""

    name: str  # what --model takes, e.g. "smollm2"
    title: str  # for messages, e.g. "SmolLM2-135M-Instruct"
    cache_name: str
    source: WheelGguf
    extra: str  # the pip extra that installs the conversion dependencies


def _say(msg: str) -> None:
    print(f"kernelloop: {msg}", file=sys.stderr, flush=True)


def _read_manifest(model_dir: Path) -> dict:
    try:
        data = json.loads((model_dir / MANIFEST).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ModelLoadError(f"{model_dir} has no {MANIFEST} (a damaged conversion?); delete the directory "
                             "and run again to convert anew") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ModelLoadError(f"{model_dir / MANIFEST} is unreadable ({type(exc).__name__}); delete {model_dir} "
                             "and run again to convert anew") from None
    if not isinstance(data, dict):
        raise ModelLoadError(f"{model_dir / MANIFEST} is not a manifest; delete {model_dir} and run again")
    return data


def verify_converted(model_dir: Path, model: GgufModel, full: bool = False) -> None:
    """Raise a one-line ModelLoadError unless `model_dir` holds a complete conversion of `model`.

    Cheap unless `full` (see the module docstring); a manifest of another CONVERT_FORMAT raises too.
    """
    manifest = _read_manifest(model_dir)

    def bad(why: str) -> ModelLoadError:
        return ModelLoadError(f"{model_dir} does not match its manifest ({why}); delete the directory and run "
                              "again to convert anew")

    if manifest.get("format") != CONVERT_FORMAT:
        raise bad(f"format {manifest.get('format')!r}, this converter writes {CONVERT_FORMAT}")
    source = manifest.get("source")
    if not isinstance(source, dict) or source.get("sha256") != model.source.sha256:
        got = source.get("sha256") if isinstance(source, dict) else None
        raise bad(f"converted from a source with sha256 {str(got)[:12]}..., expected {model.source.sha256[:12]}...")
    files = manifest.get("files")
    if not isinstance(files, dict) or any(name not in files for name in REQUIRED_FILES):
        raise bad(f"the file list lacks one of {', '.join(REQUIRED_FILES)}")
    for name, facts in files.items():
        path = model_dir / name
        try:
            size, digest = int(facts["size"]), str(facts["sha256"])
        except (KeyError, TypeError, ValueError):
            raise bad(f"malformed entry for {name}") from None
        if "/" in name or name.startswith("."):
            raise bad(f"odd file name {name!r}")
        if not path.is_file():
            raise bad(f"{name} is missing")
        if path.stat().st_size != size:
            raise bad(f"{name} has {path.stat().st_size} bytes, {size} recorded")
        if (full or size < HASH_LIMIT) and sha256_file(path) != digest:
            raise bad(f"{name} has another sha256 than recorded")


def missing_deps() -> list[str]:
    return [name for name in CONVERT_DEPS if importlib.util.find_spec(name) is None]


def _versions() -> dict[str, str]:
    out = {"kernelloop_convert_format": str(CONVERT_FORMAT)}
    for dist in ("transformers", "gguf", "torch", "tokenizers", "safetensors", "accelerate"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = "absent"
    return out


def _fix_pre_tokenizer(gguf_path: Path, tokenizer_file: Path) -> None:
    """Restore the digit splitting that transformers' GGUF reader drops (see INDIVIDUAL_DIGITS_PRE)."""
    from gguf import GGUFReader
    from tokenizers import Tokenizer, pre_tokenizers

    field = GGUFReader(str(gguf_path)).fields.get("tokenizer.ggml.pre")
    pre = field.contents() if field is not None else None
    if pre not in INDIVIDUAL_DIGITS_PRE:
        return
    tok = Tokenizer.from_file(str(tokenizer_file))
    current = json.dumps(json.loads(tok.to_str()).get("pre_tokenizer"))
    if '"Digits"' in current:
        return
    parts = [pre_tokenizers.Digits(individual_digits=True)]
    if tok.pre_tokenizer is not None:
        parts.append(tok.pre_tokenizer)
    tok.pre_tokenizer = pre_tokenizers.Sequence(parts)
    tok.save(str(tokenizer_file))


def _version_tuple(version: str) -> tuple[int, ...]:
    """(major, minor) of a version string such as "4.56.0.dev0"."""
    return tuple(int(re.match(r"\d*", piece).group() or 0) for piece in version.split(".")[:2])


def convert_gguf(gguf_path: Path, out_dir: Path) -> None:
    """Dequantize the Llama-family GGUF `gguf_path` to float32 and write it into `out_dir` (HF format)."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    where = dict(gguf_file=gguf_path.name, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), **where)
    dtype_kw = "dtype" if _version_tuple(importlib.metadata.version("transformers")) >= (4, 56) else "torch_dtype"
    model = AutoModelForCausalLM.from_pretrained(str(gguf_path.parent), **{dtype_kw: torch.float32}, **where)
    config = model.config.to_dict()
    if config.get("model_type") != "llama":
        raise ModelLoadError(f"{gguf_path.name}: architecture {config.get('model_type')!r} is not supported (llama)")
    config = {k: v for k, v in config.items() if not k.startswith("_") and k not in _CONFIG_NOISE}
    config.update(architectures=["LlamaForCausalLM"], dtype="float32")
    tied = bool(config.get("tie_word_embeddings"))
    tensors = {name: t.detach().to(torch.float32).contiguous() for name, t in model.state_dict().items()
               if not (tied and name == "lm_head.weight") and not name.endswith("rotary_emb.inv_freq")}
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    (out_dir / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    model.generation_config.save_pretrained(str(out_dir))
    del model, tensors
    tokenizer.save_pretrained(str(out_dir))
    tok_config = out_dir / "tokenizer_config.json"
    data = json.loads(tok_config.read_text(encoding="utf-8"))
    for key in ("is_local", "local_files_only", "name_or_path"):  # artifacts of loading from a local GGUF
        data.pop(key, None)
    data["tokenizer_class"] = "PreTrainedTokenizerFast"  # tokenizer.json as is, in transformers 4 and 5
    tok_config.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    _fix_pre_tokenizer(gguf_path, out_dir / "tokenizer.json")


def _write_manifest(out_dir: Path, model: GgufModel, seconds: float) -> None:
    files = {p.name: {"size": p.stat().st_size, "sha256": sha256_file(p)}
             for p in sorted(out_dir.iterdir()) if p.is_file() and p.name != MANIFEST}
    src = model.source
    manifest = {"format": CONVERT_FORMAT, "model": model.name, "title": model.title,
                "source": {"package": src.package, "version": src.version, "member": src.member,
                           "sha256": src.sha256},
                "files": files, "converter": _versions(), "convert_seconds": round(seconds, 1)}
    tmp = out_dir / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    with tmp.open("rb") as f:
        os.fsync(f.fileno())
    os.rename(tmp, out_dir / MANIFEST)


def _is_current(target: Path, model: GgufModel) -> bool:
    """True for a valid conversion; False when there is none or one of an older format (to redo)."""
    if not target.exists():
        return False
    if (target / MANIFEST).is_file():
        try:
            fmt = json.loads((target / MANIFEST).read_text(encoding="utf-8")).get("format")
        except (OSError, UnicodeDecodeError, ValueError, AttributeError):
            fmt = CONVERT_FORMAT  # unreadable: verify_converted reports it
        if isinstance(fmt, int) and fmt < CONVERT_FORMAT:
            _say(f"{target} was converted by an older kernelloop; converting again")
            return False
    verify_converted(target, model)
    return True


def ensure_converted(model: GgufModel, cache_root: Path) -> Path:
    """The converted directory of `model` under `cache_root`, converting it on first use."""
    target = cache_root / "models" / model.cache_name
    if _is_current(target, model):
        return target
    missing = missing_deps()
    if missing:
        raise ModelLoadError(f"converting {model.name} needs {', '.join(CONVERT_DEPS)} (missing: "
                             f"{', '.join(missing)}): pip install 'kernelloop[{model.extra}]'")
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f"{target.name}.lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if _is_current(target, model):  # another process converted it while we waited
            return target
        for stale in target.parent.glob(f".{target.name}.tmp-*"):  # left by a killed conversion (we hold the lock)
            shutil.rmtree(stale, ignore_errors=True)
        work = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
        try:
            out = work / "model"
            src_dir = work / "source"
            out.mkdir()
            src_dir.mkdir()
            gguf_path = locate_gguf(model.source, cache_root / "downloads", src_dir)
            _say(f"converting {model.title} ({gguf_path.name}) once into {target}")
            start = time.monotonic()
            try:
                convert_gguf(gguf_path, out)
            except (ModelLoadError, KeyboardInterrupt):
                raise
            except Exception as exc:  # transformers' own errors: one line, the cause kept for -v tracebacks
                first = (str(exc).strip().splitlines() or [""])[0][:300]
                raise ModelLoadError(f"converting {gguf_path.name} with transformers failed "
                                     f"({type(exc).__name__}: {first})") from exc
            _write_manifest(out, model, time.monotonic() - start)
            os.chmod(out, 0o755)  # mkdtemp and safetensors make things private; the cache is readable
            for path in out.iterdir():
                os.chmod(path, 0o644)
            if target.exists():  # an older format: move aside, then delete
                os.rename(target, work / "old")
            os.rename(out, target)
            _say(f"converted in {time.monotonic() - start:.0f} s")
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return target
