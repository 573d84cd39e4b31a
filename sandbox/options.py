"""What a sandbox run is asked to do: one frozen bundle of options, shared by every candidate of a batch."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from kernelloop.kernels.device import CPU, Device


@dataclass(frozen=True)
class CheckOptions:
    """Options of `judge_files` (and `agent check`).

    device:       "cpu" (Triton interpreter) or "cuda".
    registry:     registry whose current choice is the timing baseline; None: the default registry.
    registry_baseline: False times against the op's own kernel whatever the registry holds (agent
                  verify re-judging an entry against what it replaced).
    dtypes:       dtype names to check; empty: every dtype the op supports.
    shapes:       extra shapes to check (e.g. those an engine profile saw), on top of the op's own.
    timing_shape: the shape timed A/B; None: a default per device (see sandbox.judge.plan).
    timing_dtype: the dtype timed; None: float32 on CPU, bfloat16 on CUDA (when supported).
    timing:       False skips the A/B timing (correctness only; `accepted` is then False).
    min_gain:     accept only when the speedup interval's lower bound exceeds 1 + min_gain.
    rounds:       interleaved A/B timing rounds; None: 7 on CPU, 15 on CUDA.
    confirm:      as many rounds again (fresh seeds) when the planned rounds' median clears the bar
                  and their interval does not, if the budget has room; the verdict is then judged on
                  all rounds at the error the first look left (sandbox.judge.decisions.judge_timing).
    timeout_s:    wall-clock limit of one candidate's whole run; None: the device's default
                  (sandbox/judge/budget.py: 180 s on CPU, 120 s on CUDA), shared between correctness and timing.
    memory_mb:    memory a candidate may use beyond the pre-warmed process it starts from.
    seed:         master seed for input seeds; None: secret (drawn from os.urandom per batch).
    static_check: False skips the static pre-check (tests use it to prove the runtime guards).
    fork_server:  False starts a fresh interpreter per candidate (slower; the benchmark's reference).
    unconfined:   True judges without the operating system's confinement (sandbox/inside/confine.py) where it
                  cannot be set up; every verdict records it. Never the default.
    batch_invariance: False skips the batch invariance probe of a correct candidate (its verdict's
                  `batch_invariant` stays None); tests that are not about it save its calls.
    compile_for:  GPU targets ("sm90", "sm80", ...) a correct candidate is also compiled for, on any
                  device, before timing; a kernel that does not compile, spills or overflows shared
                  memory is refused (`compile-target`). Empty: no compile check.
    """

    device: Device = CPU  # a name ("cpu", "cuda") is turned into its Device; JSON holds the name
    registry: Path | None = None
    registry_baseline: bool = True
    dtypes: tuple[str, ...] = ()
    shapes: tuple[dict, ...] = field(default_factory=tuple)
    timing_shape: dict | None = None
    timing_dtype: str | None = None
    timing: bool = True
    min_gain: float = 0.03
    rounds: int | None = None
    confirm: bool = True
    timeout_s: float | None = None
    memory_mb: int = 4096
    seed: int | None = None
    static_check: bool = True
    fork_server: bool = True
    unconfined: bool = False
    compile_for: tuple[str, ...] = ()
    batch_invariance: bool = True
    baseline: tuple[str, str] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "device", Device.of(self.device))

    def to_json(self) -> dict[str, Any]:
        """Plain JSON data (a Path as text, tuples as lists); `from_json` gives back an equal object."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, (Path, Device)):
                value = str(value)
            elif isinstance(value, tuple):
                value = [dict(v) if isinstance(v, dict) else v for v in value]
            elif isinstance(value, dict):
                value = dict(value)
            out[f.name] = value
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "CheckOptions":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown check options: {', '.join(unknown)}")
        values = dict(data)
        if values.get("registry") is not None:
            values["registry"] = Path(values["registry"])
        for name in ("dtypes", "shapes", "compile_for"):
            if name in values:
                values[name] = tuple(dict(v) if isinstance(v, dict) else v for v in values[name])
        if values.get("baseline") is not None:
            source, label = values["baseline"]
            values["baseline"] = (source, label)
        return cls(**values)
