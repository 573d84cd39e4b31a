"""The profile's one typed definition (kernelloop/common/profile_contract.py): what `assemble()` returns is what
the TypedDicts declare, key for key and type for type, and history stores exactly the declared columns."""

from __future__ import annotations

import json
import types
import typing
from pathlib import Path
from typing import Any, Literal, NotRequired, TypedDict, get_args, get_origin

import pytest

from kernelloop.common import profile_contract
from kernelloop.common.profile_contract import (
    PROFILE_COLUMNS,
    PROFILE_JSON_ONLY,
    PROFILE_ROW_COLUMNS,
    ROW_JSON_ONLY,
    Profile,
    ProfileRow,
    ShapeSeen,
)
from kernelloop.history import History
from kernelloop.kernels.roofline import Rates
from kernelloop.profiler.profile import assemble

RAW = {"device": "cpu", "region_timing": "cpu-wall", "op_timing": "cpu-wall", "replay_errors": ["rope: boom"],
       "counters": {"generated_tokens": 12, "prompt_tokens": 40, "cached_prompt_tokens": 10},
       "regions": {"step": {"calls": 4, "seconds": 1.0}, "forward": {"calls": 4, "seconds": 0.8},
                   "sample": {"calls": 4, "seconds": 0.1}, "schedule": {"calls": 4, "seconds": 0.05}},
       "variants": {"rmsnorm": {"float32": "baseline"}},
       "ops": [{"op": "rmsnorm", "dtype": "float32", "shape": {"tokens": 3, "hidden": 64}, "calls": 5, "seconds": 0.2,
                "timing": "cpu-wall", "in_run_seconds": 0.2},
               {"op": "rmsnorm", "dtype": "float32", "shape": {"tokens": 9, "hidden": 64}, "calls": 2, "seconds": 0.1},
               {"op": "linear", "dtype": "float32", "shape": {"tokens": 3, "n": 96, "k": 64}, "calls": 4, "seconds": 0.3}]}


def _profile(raw: dict[str, Any] = RAW) -> Profile:
    return assemble(raw, fingerprint="cpu-interpreter", engine="in-process", model="tiny", kernels="baseline",
                    wall_seconds=2.0, requests=3, latencies={"ttft_ms_median": 12.0, "tpot_ms_median": None},
                    rates=lambda dtype: Rates(1e9, 1e12), notes=["waited"], cancelled_requests=1)


def _conforms(value: Any, hint: Any) -> bool:
    """`value` has the type `hint` says (the hints a profile uses: scalars, unions, Literal, list, dict,
    TypedDicts)."""
    origin, args = get_origin(hint), get_args(hint)
    if origin is NotRequired:
        return _conforms(value, args[0])
    if origin in (typing.Union, types.UnionType):
        return any(_conforms(value, a) for a in args)
    if origin is Literal:
        return value in args
    if origin is list:
        return isinstance(value, list) and all(_conforms(v, args[0]) for v in value)
    if origin is dict:
        return isinstance(value, dict) and all(_conforms(k, args[0]) and _conforms(v, args[1]) for k, v in value.items())
    if typing.is_typeddict(hint):
        return isinstance(value, dict) and not _problems(value, hint)
    if hint is Any:
        return True
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is type(None):
        return value is None
    return isinstance(value, hint)


def _problems(value: dict[str, Any], typed: Any) -> list[str]:
    """What in `value` does not match the TypedDict `typed`: keys not declared, required keys missing,
    values of the wrong type."""
    hints = typing.get_type_hints(typed, include_extras=True)
    out = [f"{typed.__name__} does not declare {k!r}" for k in value if k not in hints]
    out += [f"{typed.__name__} lacks {k!r}" for k in typed.__required_keys__ if k not in value]
    out += [f"{typed.__name__}[{k!r}] = {value[k]!r} is not {hints[k]}" for k in hints
            if k in value and not _conforms(value[k], hints[k])]
    return out


def test_assemble_returns_exactly_the_declared_keys_with_the_declared_types() -> None:
    profile = _profile()
    assert not _problems(profile, Profile)
    assert set(profile) == Profile.__required_keys__  # the optional keys are added by `agent profile`
    ops = [r for r in profile["rows"] if r["kind"] == "op"]
    others = [r for r in profile["rows"] if r["kind"] == "other"]
    assert {r["name"] for r in ops} == {"rmsnorm", "linear"} and len(others) == 4
    assert all(set(r) == set(ProfileRow.__annotations__) for r in ops)  # in_run_s too
    assert all(set(r) == ProfileRow.__required_keys__ for r in others)
    assert all(set(s) == set(ShapeSeen.__annotations__) for r in ops for s in r["shapes"])


def test_an_empty_recording_still_fits_the_contract() -> None:
    profile = _profile({})
    assert not _problems(profile, Profile)
    assert profile["rows"] == [] and profile["op_timing"] is None and profile["prefix_hit_rate"] is None


def test_the_checker_sees_a_key_the_contract_does_not_declare() -> None:
    """The two tests above can fail: an undeclared key, a missing key or a wrong type is seen."""
    profile: dict[str, Any] = dict(_profile())
    assert not _problems(profile, Profile)
    assert _problems({**profile, "gpu_watts": 300.0}, Profile) == ["Profile does not declare 'gpu_watts'"]
    del profile["steps"]
    assert _problems(profile, Profile) == ["Profile lacks 'steps'"]
    assert _problems({**_profile(), "steps": "4"}, Profile) == ["Profile['steps'] = '4' is not <class 'int'>"]
    row = dict(_profile()["rows"][0], kind="kernel")
    assert _problems(row, ProfileRow) and _problems({**_profile(), "rows": [row]}, Profile)


def _table_columns(path: Path, table: str) -> set[str]:
    with History(path) as hist:
        return set(hist.db[table].columns_dict)


def test_history_tables_hold_exactly_the_declared_columns(tmp_path: Path) -> None:
    """A key added to Profile or ProfileRow is either a new history column (a migration) or listed
    as JSON-only in kernelloop/common/profile_contract.py: never silently dropped."""
    path = tmp_path / "h.db"
    assert _table_columns(path, "profiles") == {*PROFILE_COLUMNS, "id", "raw_json"}
    assert _table_columns(path, "profile_ops") == {*PROFILE_ROW_COLUMNS, "id", "profile_id", "shapes_json"}
    assert set(PROFILE_COLUMNS) | PROFILE_JSON_ONLY == set(Profile.__annotations__)
    assert set(PROFILE_ROW_COLUMNS) | ROW_JSON_ONLY == set(ProfileRow.__annotations__)


def test_history_stores_every_column_of_an_assembled_profile(tmp_path: Path) -> None:
    profile = _profile()
    with History(tmp_path / "h.db") as hist:
        pid = hist.record_profile(profile)
        stored = hist.latest_profile()
        raw = hist.db.execute("SELECT raw_json FROM profiles WHERE id = ?", [pid]).fetchone()[0]
    assert stored is not None
    assert {k: stored[k] for k in PROFILE_COLUMNS} == {k: profile[k] for k in PROFILE_COLUMNS}
    assert not set(stored) & (PROFILE_JSON_ONLY - {"rows"})
    assert json.loads(raw) == profile
    for got, row in zip(stored["rows"], profile["rows"], strict=True):
        assert {k: got[k] for k in PROFILE_ROW_COLUMNS} == {k: row[k] for k in PROFILE_ROW_COLUMNS}
        assert got["shapes"] == row["shapes"]


def test_json_only_keys_must_be_declared() -> None:
    class Small(TypedDict):
        a: int
        b: str

    assert profile_contract._columns(Small, frozenset({"b"})) == ("a",)
    with pytest.raises(TypeError, match="Small declares no c"):
        profile_contract._columns(Small, frozenset({"c"}))
