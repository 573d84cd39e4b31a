"""The manifest file: JSON, one object with a format number and a list of entries.

Writes are atomic (temp file in the same folder, fsync, rename): a reader sees the old manifest
or the new one, never half of one.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from kernelloop.common.errors import RegistryError
from kernelloop.kernels.registry.entry import Entry

FORMAT = 1
MANIFEST_NAME = "manifest.json"


def parse_manifest(text: str, where: str) -> list[Entry]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RegistryError(f"registry manifest {where} is corrupt ({exc}); baselines stay in use") from None
    if not isinstance(data, dict) or not isinstance(data.get("entries"), list):
        raise RegistryError(f"registry manifest {where} is corrupt (no entries list); baselines stay in use")
    if data.get("format") != FORMAT:
        raise RegistryError(f"registry manifest {where} has format {data.get('format')!r}, expected {FORMAT}")
    entries = [Entry.from_dict(d, f"registry manifest {where}, entry {i}") for i, d in enumerate(data["entries"])]
    keys = [e.key for e in entries]
    if len(set(keys)) != len(keys):
        raise RegistryError(f"registry manifest {where} is corrupt (two entries for the same key)")
    return entries


def render_manifest(entries: list[Entry]) -> str:
    ordered = sorted(entries, key=lambda e: e.key)
    return json.dumps({"format": FORMAT, "entries": [e.to_dict() for e in ordered]}, indent=2) + "\n"


def atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
