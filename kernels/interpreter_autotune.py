"""`@triton.autotune` on Triton's CPU interpreter.

Triton's `Autotuner` times every config with the GPU driver's benchmarker, which does not exist
without a GPU, so any kernel with several configs (most of FlagGems) fails on CPU as written. Under
the interpreter this module replaces only how a config is chosen; everything else is Triton's own
`Autotuner.run`: the tuning key (the `key` arguments and every tensor argument's dtype), one choice
per key cached for the process, `prune_configs_by` (`early_config_prune`, then `perf_model` and
`top_k`), `reset_to_zero` and the autotuner's `pre_hook(reset_only=True)` before the first launch of
a key, each config's `pre_hook`, `post_hook`, and `@triton.heuristics` stacked above or below.

The choice (`policy`): no timing. The config whose launch grid has the fewest program instances wins,
ties to the earlier config (a grid that cannot be evaluated counts as unbounded). Interpreted, a
program costs about a millisecond whatever its block does, so this is what the CPU engine would pick by
timing, without timing's noise: the choice, and with it the output's bits, is the same in every process
and on every machine, and the sandbox times exactly the config the engine will serve. No config is run
to choose one, so `restore_value` has nothing to restore. Interpreter timings never exist, so none can
choose a GPU kernel (Triton also keeps no autotune disk cache while interpreting; registry entries are
per device).

The sandbox (`pin`): a kernel with several configs must be correct in every config any device could
pick. The judge's runner pins a slot per call: slot s makes every autotuned kernel use config
`s mod len(configs)` of the configs left after pruning (a config `prune_configs_by` removes for a
call can never run on any device, so it is never pinned), and the judge numbers its trials from a
secret offset, so the battery goes round every config and a kernel cannot tell which trial gets which.
The first call of a key goes through Triton's tuning path (its resets run, as in a process that just
started); later calls swap the cached choice, as in a process that tuned differently. A call without a
slot (timing, the engine) uses the policy.
"""

from __future__ import annotations

import inspect
import math
from typing import Any

_SLOT: int | None = None  # the sandbox runner's pin for the current call; None: the policy

# Autotuner members replaced, with the parameters they must have (guards against a changed Triton).
_EXPECTED = {"run": ["self", "args", "kwargs"], "prune_configs": ["self", "kwargs"],
             "_bench": ["self", "args", "config", "meta"]}


def pin(slot: int | None) -> None:
    """Use config `slot mod n` of every autotuned kernel from now on (None: the policy's choice)."""
    global _SLOT
    _SLOT = None if slot is None else int(slot)


def pinned() -> int | None:
    """The slot pinned now (None: the policy), for a caller that pins and must restore it."""
    return _SLOT


class _Tuning:
    """Per-Autotuner bookkeeping: the key being launched, each key's configs after pruning, and the keys
    whose cached choice was last set by a pin."""

    def __init__(self) -> None:
        self.key: tuple = ()
        self.configs: dict[tuple, list[Any]] = {}
        self.pinned: set[tuple] = set()


def _tuning(autotuner: Any) -> _Tuning:
    state = autotuner.__dict__.get("_kernelloop_tuning")
    if state is None:
        state = autotuner.__dict__["_kernelloop_tuning"] = _Tuning()
    return state


def _key(autotuner: Any, args: tuple, kwargs: dict[str, Any]) -> tuple:
    """The tuning key exactly as Triton's Autotuner.run computes it."""
    named = {**dict(zip(autotuner.arg_names, args)), **kwargs}
    named = {k: v for k, v in named.items() if k in autotuner.arg_names}
    key = [named[k] for k in autotuner.keys if k in named]
    key += [str(v.dtype) for v in named.values() if hasattr(v, "dtype")]
    return tuple(key)


def programs(autotuner: Any, meta: dict[str, Any], config: Any) -> float:
    """Program instances `config` launches: the grid evaluated on the call's named arguments, its
    meta-parameters, the config's and those of `@triton.heuristics` stacked below (inf when it cannot be)."""
    from triton.runtime.autotuner import Heuristics

    grid = meta.get("grid")
    named = {**(autotuner.nargs or {}), **{k: v for k, v in meta.items() if k not in ("grid", "warmup")},
             **config.all_kwargs()}
    fn = autotuner.fn
    try:
        while isinstance(fn, Heuristics):  # what they set is in the grid's meta at launch
            for name, rule in fn.values.items():
                named[name] = rule(named)
            fn = fn.fn
        dims = grid(named) if callable(grid) else grid
        dims = dims if isinstance(dims, (tuple, list)) else (dims,)
        return float(math.prod(int(d) for d in dims))
    except Exception:  # noqa: BLE001  (a grid that needs what only a launch has: no preference)
        return math.inf


def replacements() -> list[tuple[Any, str, Any]]:
    """(owner, name, value) for kernels/interpreter_fidelity.py to apply (and undo) with its own."""
    from triton.runtime.autotuner import Autotuner as autotuner_cls

    for name, params in _EXPECTED.items():
        if list(inspect.signature(getattr(autotuner_cls, name)).parameters) != params:
            raise TypeError(f"Autotuner.{name} has an unexpected signature")
    original_run, original_prune = autotuner_cls.run, autotuner_cls.prune_configs

    def run(self, *args, **kwargs):  # noqa: ANN001, ANN202
        if len(self.configs) > 1:
            state = _tuning(self)
            key = state.key = _key(self, args, kwargs)
            if key in self.cache and key in state.configs:
                if _SLOT is not None:  # as if this process had tuned the key to the pinned config
                    pruned = state.configs[key]
                    self.cache[key] = pruned[_SLOT % len(pruned)]
                    state.pinned.add(key)
                elif key in state.pinned:  # back to the policy: tuned again (nothing runs to choose)
                    del self.cache[key]
                    state.pinned.discard(key)
            elif _SLOT is not None:
                state.pinned.add(key)
        return original_run(self, *args, **kwargs)

    def prune_configs(self, kwargs):  # noqa: ANN001, ANN202
        pruned = original_prune(self, kwargs)
        state = _tuning(self)
        state.configs[state.key] = list(pruned)
        return pruned

    def _bench(self, *args, config, **meta):  # noqa: ANN001, ANN202
        """A score in place of a timing (Triton keeps the config with the least)."""
        if _SLOT is not None:
            pruned = _tuning(self).configs.get(_tuning(self).key) or [config]
            index = next((i for i, c in enumerate(pruned) if c is config), 0)
            score = 0.0 if index == _SLOT % len(pruned) else 1.0
        else:
            score = programs(self, meta, config)
        return [score, score, score]

    return [(autotuner_cls, "run", run), (autotuner_cls, "prune_configs", prune_configs),
            (autotuner_cls, "_bench", _bench)]
