"""Dispatch: the one call the engine makes per op.

    kd = Dispatcher(mode="registry", registry=Registry(), device=CUDA)
    y = kd.rmsnorm(x, weight, eps)

Per (op, dispatch key) the variant is resolved once and cached: the registry's entry for
(device, dtype, shape bucket), else the op's baseline Triton kernel, else the torch reference (`fallback="reference"` skips the
baseline: a CPU engine then serves the fast torch reference wherever no registry entry applies).
A variant that raises is demoted to the next in that chain for that key, and the call is retried;
the demotion is logged and listed (`demotions`, shown by the engine's /metrics) until the next
reload. A registry kernel is loaded as the judge loaded it (kernels/candidate/loader.py) and raises
ImpureModule after a call that changed its module's state: demoted the same way. Running out of
memory demotes nothing: it is not the kernel's fault, and the caller decides.
A registry kernel is never handed more tokens than its device's judge checked it at
(`OpSpec.judged_tokens`: the scheduler's whole budget on a GPU, fewer on the CPU interpreter): a
larger call goes to the baseline.
With `deterministic`, only batch-invariant variants serve (kernels/deterministic.py); what serves in
place of a registry entry is listed (`deterministic_fallbacks`, on /metrics).
`reload()` re-reads the registry and swaps every op's cache in one assignment, so a call sees the
old variants or the new ones, never a mix within one op.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Literal, Mapping

import torch

from kernelloop.common.errors import RegistryError
from kernelloop.kernels import deterministic as det
from kernelloop.kernels.device import CPU, Device
from kernelloop.kernels.ops import OPS
from kernelloop.kernels.registry import Entry, Registry, select_entry
from kernelloop.kernels.scoped import Projections
from kernelloop.kernels.spec import TOKEN_BUDGET, OpSpec, dtype_name

log = logging.getLogger(__name__)

# Not a kernel's fault: re-raised without demoting it (the engine fails or retries the batch).
TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (MemoryError, torch.OutOfMemoryError)

Mode = Literal["reference", "baseline", "registry"]
MODES: tuple[str, ...] = ("reference", "baseline", "registry")
Fallback = Literal["baseline", "reference"]
FALLBACKS: tuple[str, ...] = ("baseline", "reference")


@dataclass(frozen=True)
class Variant:
    name: str  # "reference", "baseline" or "registry:<entry id>"
    fn: Callable[..., Any]


@dataclass(frozen=True)
class Demotion:
    """A variant that raised for one (dtype, bucket) and was replaced by the next in its chain."""

    op: str
    where: str      # "dtype bucket"
    variant: str    # the one that raised
    now: str        # the one serving instead
    error: str      # "ExceptionType: message", one line


class OpDispatch:
    """Callable for one op; holds that op's cache: dispatch key -> variant chain."""

    def __init__(self, spec: OpSpec, owner: "Dispatcher", scope: str = ""):
        self.spec = spec
        self.scope = scope  # "": every call site; else the one projection this dispatch serves
        self._owner = owner
        self._key = spec.dispatch_key
        self._cache: dict[tuple, list[Variant]] = {}
        self._where: dict[tuple, tuple[str, str]] = {}  # dispatch key -> (dtype name, bucket)

    def __call__(self, *args: Any) -> Any:
        observer = self._owner.observer
        if observer is None:
            return self._dispatch(args)
        with observer(self.spec, args):
            return self._dispatch(args)

    def _dispatch(self, args: tuple) -> Any:
        key = self._key(*args)
        chain = self._cache.get(key)
        if chain is None:
            chain = self._miss(key, args)
        try:
            return chain[0].fn(*args)
        except TRANSIENT_ERRORS:
            raise
        except Exception as exc:
            if len(chain) == 1:
                raise
            log.exception("%s variant %s failed; falling back to %s", self.spec.name, chain[0].name, chain[1].name)
            error = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
            self._owner.demotions.append(Demotion(self.spec.name, " ".join(self._where[key]), chain[0].name,
                                                  chain[1].name, error))
            self._cache = {**self._cache, key: chain[1:]}
            return self._dispatch(args)

    def _miss(self, key: tuple, args: tuple) -> list[Variant]:
        where = (dtype_name(args[0].dtype), self.spec.bucket(self.spec.shape_of(*args)))
        chain = self._owner.resolve(self.spec, *where, scope=self.scope)
        self._where[key] = where
        self._cache = {**self._cache, key: chain}
        return chain

    def re_resolve(self) -> dict[str, tuple[str, str]]:
        """Resolve every cached key again; returns {"dtype bucket": (old, new)} that changed."""
        fresh: dict[tuple, list[Variant]] = {}
        changed: dict[str, tuple[str, str]] = {}
        for key, chain in self._cache.items():
            dtype, bucket = self._where[key]
            fresh[key] = self._owner.resolve(self.spec, dtype, bucket, scope=self.scope)
            if fresh[key][0].name != chain[0].name:
                changed[f"{dtype} {bucket}"] = (chain[0].name, fresh[key][0].name)
        self._cache = fresh  # one assignment: callers see the old cache or the new one
        return changed

    def variants_in_use(self) -> dict[str, str]:
        """"dtype bucket" -> name of the variant serving it, for every shape seen so far."""
        return {" ".join(self._where[key]): chain[0].name for key, chain in self._cache.items()}


class Dispatcher:
    def __init__(
        self,
        mode: Mode = "registry",
        registry: Registry | None = None,
        device: Device = CPU,
        ops: Mapping[str, OpSpec] = OPS,
        fallback: Fallback = "baseline",
        deterministic: bool = False,
    ):
        if mode not in MODES:
            raise ValueError(f"unknown kernel mode {mode!r}; expected one of {', '.join(MODES)}")
        if fallback not in FALLBACKS:
            raise ValueError(f"unknown fallback {fallback!r}; expected one of {', '.join(FALLBACKS)}")
        self.mode = mode
        self.deterministic = deterministic
        self.fallback = fallback  # what serves an op no registry entry covers: its baseline or the reference
        self.registry = registry if registry is not None else (Registry() if mode == "registry" else None)
        self.device = device
        self.fingerprint = device.fingerprint  # as registry entries name the device
        self.registry_error: str | None = None
        # Profiling hook: observer(spec, args) -> context manager around each call; None costs one check.
        self.observer: Callable[[OpSpec, tuple], ContextManager] | None = None
        self.revision: str | None = None  # registry commit served; None: HEAD at the last (re)load
        self.commit: str | None = None  # the full sha of the registry commit served (None: no registry commit)
        self.demotions: list[Demotion] = []  # since the last (re)load, which re-resolves every chain
        self._entries = self._read_entries()
        self._loaded: dict[str, Callable | None] = {}
        self.ops: dict[str, OpDispatch] = {name: OpDispatch(spec, self) for name, spec in ops.items()}
        self.projections = Projections(ops, lambda spec, scope: OpDispatch(spec, self, scope), self.fingerprint)
        self.projections.set_entries(self._entries)
        for name, op in self.ops.items():
            setattr(self, name, op)  # kd.rmsnorm(...) without __getattr__ on the hot path

    def __call__(self, op: str, *args: Any) -> Any:
        return self.ops[op](*args)

    def linear_at(self, scope: str, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """The projection `scope` (the engine's parameter name, "layers.3.down_proj"): through its quantization
        scheme's op when the registry's scoped entries (or a plan) quantize it, else the op `linear`."""
        served = self.projections.served(scope, x.dtype)
        if served is None:
            return self.linear(x, weight, bias)
        op, chosen = served
        return op(x, *self.projections.quantized(scope, chosen, weight), bias)

    def set_quant_plan(self, plan: Mapping[str, str]) -> None:
        """Quantize these scopes (scope -> scheme name) in this process, over the registry's selection; {} clears it.
        How agent quantize measures a selection on an engine before anything is committed."""
        self.projections.set_plan(plan)

    def resolve(self, spec: OpSpec, dtype: str, bucket: str, scope: str = "") -> list[Variant]:
        """The fallback chain for (op, dtype, bucket) on this device: [registry entry], baseline, reference.
        `scope`: the chain of one projection (its scoped entry, if any)."""
        if self.deterministic:
            return self._deterministic(spec, dtype, bucket, scope)
        reference = Variant("reference", spec.reference)
        if self.mode == "reference":
            return [reference]
        chain = [Variant("baseline", spec.forward), reference]
        if self.mode == "registry" and self.fallback == "reference":
            chain = [reference]
        if self.mode == "registry":
            entry = select_entry(self._entries, spec.name, self.fingerprint, dtype, bucket, scope)
            fn = self._load(entry) if entry is not None else None
            if fn is not None:
                chain.insert(0, Variant(f"registry:{entry.id}", _within_judged_tokens(spec, fn, self.device)))
        return chain

    def _deterministic(self, spec: OpSpec, dtype: str, bucket: str, scope: str = "") -> list[Variant]:
        """[an invariant registry entry], then the op's deterministic fallback; both invariant."""
        name, fn = det.fallback(spec, "reference" if self.fallback == "reference" else self.mode)
        chain = [Variant(name, fn)] + ([Variant(det.ROWWISE, det.rowwise(spec))] if name != det.ROWWISE else [])
        entry = (det.invariant_entry(self._entries, spec, self.fingerprint, dtype, bucket, scope)
                 if self.mode == "registry" else None)
        loaded = self._load(entry) if entry is not None else None
        if loaded is not None:
            limit = spec.judged_tokens(self.device)
            served = loaded if limit >= TOKEN_BUDGET else det.chunked(spec, loaded, limit)  # never another variant
            chain.insert(0, Variant(f"registry:{entry.id}", served))
        return chain

    def deterministic_fallbacks(self) -> dict[str, dict[str, str]]:
        """Deterministic mode: op -> {"dtype bucket": variant} where no batch-invariant registry kernel serves."""
        if not self.deterministic:
            return {}
        return {op: {where: name for where, name in uses.items() if not name.startswith("registry:")}
                for op, uses in self.variants_in_use().items()}

    def reload(self, revision: str | None = None) -> dict[str, dict[str, tuple[str, str]]]:
        """Re-read the registry (its HEAD, or the commit `revision`) and re-resolve every cached shape.

        Returns {op: {"dtype bucket": (old variant, new variant)}} for what changed. Call it
        between batches; each op's cache is swapped in one assignment. A named revision is how the
        end-to-end gate alternates the registry before and after a commit; an unknown one raises
        RegistryError and changes nothing.
        """
        if revision is not None and self.mode == "registry" and self.registry is not None:
            self._entries, self.revision = self.registry.entries(revision), revision
            self.commit = self.registry.commit_of(revision)
        else:
            self._entries, self.revision = self._read_entries(), None
        self._loaded = {sha: fn for sha, fn in self._loaded.items() if fn is not None}  # retry refusals
        self.demotions = []
        changed = {name: op.re_resolve() for name, op in self.ops.items()}
        before = self.projections.scoped_entries
        if self.projections.set_entries(self._entries):  # newly quantized scopes have no dispatch to re-resolve yet
            now = self.projections.scoped_entries
            changed["quantized scopes"] = {"selection": (f"{before} scoped entries", f"{now} scoped entries")}
        return {**{name: c for name, c in changed.items() if c}, **self.projections.re_resolve()}

    def variants_in_use(self) -> dict[str, dict[str, str]]:
        """op -> {"dtype bucket": variant name} for every shape dispatched so far."""
        return {**{name: op.variants_in_use() for name, op in self.ops.items()}, **self.projections.variants_in_use()}

    # -- internals -------------------------------------------------------------------------

    def _read_entries(self) -> list[Entry]:
        if self.mode != "registry" or self.registry is None:
            return []
        try:
            head = self.registry.head()  # first: the entries read are this commit's
            entries = self.registry.entries(head)
            self.commit = head
            self.registry_error = None
            return entries
        except RegistryError as exc:
            self.registry_error, self.commit = str(exc), None
            log.error("%s", exc)
            return []

    def _load(self, entry: Entry) -> Callable | None:
        if entry.sha256 not in self._loaded:
            self._loaded[entry.sha256] = self.registry.load(entry, self.revision)
        return self._loaded[entry.sha256]


def _within_judged_tokens(spec: OpSpec, fn: Callable[..., Any], device: Device) -> Callable[..., Any]:
    """`fn`, or the baseline for a call with more tokens than the judge checks on `device` (no wrapper
    where the judge covers the scheduler's whole budget)."""
    limit = spec.judged_tokens(device)
    if limit >= TOKEN_BUDGET:
        return fn

    def within(*args: Any) -> Any:
        if spec.shape_of(*args).get("tokens", 0) > limit:
            return spec.forward(*args)
        return fn(*args)

    return within
