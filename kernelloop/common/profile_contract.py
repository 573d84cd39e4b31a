"""The profile's one typed definition: what `agent profile` prints, history stores and the agent reads.

A profile is a plain JSON-ready dict (it is stored as JSON, checkpointed by langgraph and sent over
HTTP), so its contract is a set of TypedDicts: `Profile` (the summary and its `rows`), `ProfileRow`
(one op, or one of the non-op remainders of step time) and `ShapeSeen` (one registry bucket an op
was called in). profiler/profile.py `assemble()` makes it; history/store.py stores it; the agent's
target choice, `agent profile` and the report read it.

It lives in kernelloop/common/, which every layer may import (docs/ARCHITECTURE.md). Which keys
are history columns is said here as well: every declared key is a column except those in
`PROFILE_JSON_ONLY` / `ROW_JSON_ONLY` (kept only in the profile's raw JSON). A key added to a
TypedDict is therefore either added to history's schema (a migration) or to one of those sets;
tests/test_profile_contract.py checks both ways.

Timing sources (`op_timing`, `region_timing`, a row's `timing`; see engine/recorder.py): "cpu-wall",
"cuda-events" (in-run brackets), "cuda-kernel-replay" (device time), "cpu-wall-replay".
"""

# No `from __future__ import annotations` here: with string annotations Python 3.11's TypedDict
# cannot see NotRequired, and every key would count as required.
from typing import Any, Literal, NotRequired, TypedDict


class ShapeSeen(TypedDict):
    """The calls of one op in one dtype and registry bucket."""

    dtype: str                     # torch dtype name, e.g. "bfloat16"
    bucket: str                    # the registry bucket, e.g. "hidden=64,tokens=2-16"
    shape: dict[str, int]          # the largest shape seen in that bucket (dims summed)
    calls: int                     # calls in this dtype and bucket
    seconds: float                 # their total time


class ProfileRow(TypedDict):
    """One row of the op table: an op of the library (kind "op") or a remainder of step time (kind
    "other": "other model compute", "sampling", "scheduling", "python overhead")."""

    name: str                      # the op's name, or the remainder's
    kind: Literal["op", "other"]
    calls: int                     # op calls, or calls of the region the remainder belongs to
    total_s: float                 # seconds (never negative: a negative remainder is clamped to 0)
    mean_us: float                 # total_s / calls in microseconds (0.0 without calls)
    share: float                   # fraction of engine step time; the rows' shares add up to 1
    timing: str                    # where the seconds come from; "+"-joined when an op's calls mixed sources
    in_run_s: NotRequired[float]   # op rows only: the in-run brackets' seconds (differs from total_s when replayed)
    variant: str | None            # op rows: the variants that served the calls, ", "-joined; None otherwise
    bytes_per_s: float | None      # op rows: bytes moved per second; None for other rows or no time
    roofline_pct: float | None     # op rows: least possible time on the device over the time taken, in %;
                                   # None without the device's rates (kernels/roofline.py)
    bound: Literal["memory", "compute"] | None  # the roofline side most of that least time is on
    shapes: list[ShapeSeen]        # op rows: the shapes seen, most seconds first; [] for other rows


class Profile(TypedDict):
    """One profile of an engine run (profiler/profile.py `assemble`)."""

    created_at: str                # ISO 8601, UTC, whole seconds
    device: str                    # the engine's device fingerprint ("cpu-interpreter" or the GPU's)
    engine: str                    # "in-process", or the URL of the engine profiled over HTTP
    model: str                     # model directory or served model name
    kernels: str                   # the engine's kernel mode: "reference", "baseline", "registry" (or "unknown")
    timing_label: str              # "cpu-interpreter" or "cuda": how to read the seconds
    op_timing: str | None          # how op rows were timed; None when nothing was recorded
    region_timing: str | None      # how the step regions were timed; None when nothing was recorded
    replay_errors: list[str]       # ops whose post-run replay failed (they keep their in-run times)
    partial: bool                  # the run was cut short or lost requests; see partial_reason
    partial_reason: str            # "" for a complete profile
    wall_seconds: float            # the driver's wall time over the workload
    busy_seconds: float            # engine step time (the sum of the rows' total_s, up to clock noise)
    steps: int                     # engine steps recorded
    requests: int                  # requests that finished
    output_tokens: int             # tokens generated
    tokens_per_second: float       # output_tokens / wall_seconds
    ttft_ms_median: float | None   # median time to first token, ms; None without a finished first token
    tpot_ms_median: float | None   # median time per output token after the first, ms
    prefix_hit_rate: float | None  # prompt tokens served from the prefix cache / prompt tokens; None without prompts
    notes: list[str]               # what the HTTP driver waited for, extended or cancelled
    auto_stopped: bool             # the engine ended the recording at its own time limit
    cancelled_requests: int        # requests still in flight when the window ended
    rows: list[ProfileRow]         # every row, largest total_s first
    ncu: NotRequired[dict[str, Any]]  # `agent profile --ncu OP`: profiler/ncu.py's result for that op
    history_id: NotRequired[int]   # `agent profile`: the id the history gave the profile (set after storing)
    engines: NotRequired[list[dict[str, Any]]]  # a fleet's merged profile (profiler/merge.py): each engine's
                                   # {"url", "served_tokens", "weight", "output_tokens"}


# Keys kept only in the raw JSON (profiles.raw_json), not as columns of history's tables.
PROFILE_JSON_ONLY = frozenset({"timing_label", "op_timing", "region_timing", "replay_errors", "notes",
                               "auto_stopped", "cancelled_requests", "rows", "ncu", "history_id", "engines"})
# `shapes` is stored too, as the JSON text column profile_ops.shapes_json.
ROW_JSON_ONLY = frozenset({"timing", "in_run_s", "bound", "shapes"})


def _columns(typed: type, json_only: frozenset[str]) -> tuple[str, ...]:
    keys = tuple(typed.__annotations__)
    unknown = json_only - set(keys)
    if unknown:
        raise TypeError(f"{typed.__name__} declares no {', '.join(sorted(unknown))}")
    return tuple(k for k in keys if k not in json_only)


PROFILE_COLUMNS = _columns(Profile, PROFILE_JSON_ONLY)       # the profiles table's columns (besides id, raw_json)
PROFILE_ROW_COLUMNS = _columns(ProfileRow, ROW_JSON_ONLY)    # profile_ops' (besides id, profile_id, shapes_json)
