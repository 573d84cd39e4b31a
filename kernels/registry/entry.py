"""A registry entry: one verified kernel for one (op, device, dtype, shape bucket), and optionally one scope.

A scope names the one projection of the model an entry serves ("layers.3.down_proj", "lm_head": the
engine's parameter names); "" (every call of the op) is the default. Scoped entries are how a
quantization selection is stored (agent quantize): op "linear_int8" scoped to the layers it chose.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import Any

from kernelloop.common.errors import RegistryError
from kernelloop.kernels.device import Fingerprint

ANY_BUCKET = "*"  # an entry that serves every shape of its (op, device, dtype)


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def utc_now() -> str:
    return datetime.now(timezone.utc).replace(microsecond=0).isoformat()


@dataclass(frozen=True)
class Provenance:
    proposer: str  # "search", "llm", "human", ...
    model: str | None = None  # the LLM that wrote it, if any
    prompt_hash: str | None = None
    history_id: int | None = None  # row id of the attempt in the history database


@dataclass(frozen=True)
class Entry:
    op: str
    device: Fingerprint  # "cpu-interpreter" or "<GPU name> sm<cc>"
    dtype: str  # "float32" | "float16" | "bfloat16"
    bucket: str  # OpSpec.bucket(shape), or ANY_BUCKET
    sha256: str  # of the source text
    speedup: float  # median speedup over what the engine ran before
    speedup_ci: tuple[float, float]  # bootstrap interval of the speedup
    provenance: Provenance
    verified_at: str  # ISO 8601 UTC, when the sandbox last judged it
    added_at: str = field(default_factory=utc_now)
    # The verdict's batch invariance (sandbox/judge/batch_invariance.py); None: unknown (not probed, or a manifest
    # written before the field existed). `engine serve --deterministic` serves only entries with True.
    batch_invariant: bool | None = None
    scope: str = ""  # the projection it serves ("layers.3.down_proj"); "": every call of the op

    @property
    def key(self) -> tuple[str, str, str, str, str]:
        return (self.op, self.device, self.dtype, self.bucket, self.scope)

    @property
    def id(self) -> str:
        """Stable short name: the op plus a hash of the key and the source (an unscoped entry's key
        hashes as its four fields, as before scopes existed, so ids stay stable)."""
        key = self.key if self.scope else self.key[:4]
        digest = hashlib.sha256("|".join(key + (self.sha256,)).encode()).hexdigest()
        return f"{self.op}-{digest[:10]}"

    @property
    def source_path(self) -> str:
        """Where the source lives inside the registry repository (content-addressed)."""
        return f"kernels/{self.op}/{self.sha256}.py"

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if not self.scope:
            del d["scope"]  # an unscoped entry is written as before scopes existed
        d["speedup_ci"] = list(self.speedup_ci)
        d["id"] = self.id
        d["source"] = self.source_path
        return d

    @classmethod
    def from_dict(cls, d: Any, where: str) -> "Entry":
        if not isinstance(d, dict):
            raise RegistryError(f"{where}: expected an object, got {type(d).__name__}")
        try:
            lo, hi = d["speedup_ci"]
            prov = d["provenance"]
            entry = cls(
                op=str(d["op"]), device=str(d["device"]), dtype=str(d["dtype"]), bucket=str(d["bucket"]),
                sha256=str(d["sha256"]), speedup=float(d["speedup"]), speedup_ci=(float(lo), float(hi)),
                provenance=Provenance(
                    proposer=str(prov["proposer"]), model=prov.get("model"),
                    prompt_hash=prov.get("prompt_hash"), history_id=prov.get("history_id"),
                ),
                verified_at=str(d["verified_at"]), added_at=str(d["added_at"]),
                batch_invariant=_optional_bool(d.get("batch_invariant"), "batch_invariant"),
                scope=str(d.get("scope") or ""),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise RegistryError(f"{where}: malformed entry ({type(exc).__name__}: {exc})") from None
        if len(entry.sha256) != 64:
            raise RegistryError(f"{where}: sha256 must be 64 hex digits")
        return entry


def _optional_bool(value: Any, name: str) -> bool | None:
    if value is None or isinstance(value, bool):
        return value
    raise TypeError(f"{name} must be true, false or null, got {value!r}")


def select_entry(entries: list[Entry], op: str, fingerprint: str, dtype: str, bucket: str,
                 scope: str = "") -> Entry | None:
    """The entry serving (op, device, dtype, bucket) at every call site (scope ""): an exact bucket first,
    then ANY_BUCKET. `scope` selects among the entries scoped to that one projection instead."""
    wildcard = None
    for e in entries:
        if e.op == op and e.device == fingerprint and e.dtype == dtype and e.scope == scope:
            if e.bucket == bucket:
                return e
            if e.bucket == ANY_BUCKET:
                wildcard = e
    return wildcard


def scoped_entries(entries: list[Entry], fingerprint: str, dtype: str) -> dict[str, Entry]:
    """scope -> the entry scoped to it for (device, dtype); at most one per scope (agent quantize writes one)."""
    return {e.scope: e for e in sorted(entries, key=lambda e: e.key) if e.scope and e.device == fingerprint and e.dtype == dtype}
