"""The engine: model + KV memory + scheduler + sampler, advanced one forward per `step()`.

Single-threaded by design: the server runs it in one thread and talks to it through queues, so
nothing here locks. `reload_kernels()` must be called between steps (the server does).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from kernelloop.engine.batch import ForwardBatch
from kernelloop.engine.config import ModelConfig, resolve_dtype
from kernelloop.engine.cpu_allocator import keep_freed_memory
from kernelloop.engine.cuda_graph import DecodeGraphs
from kernelloop.engine.detokenizer import IncrementalDetokenizer
from kernelloop.engine.errors import EngineError
from kernelloop.engine.memory import KVPool, RequestSlots, SlotAllocator, slots_for_budget
from kernelloop.engine.model_source import resolve_model_dir
from kernelloop.engine.models import build_model, read_config
from kernelloop.engine.radix_cache import RadixCache
from kernelloop.engine.recorder import FORWARD, SAMPLE, SCHEDULE, STEP, Recorder, region
from kernelloop.engine.request import Request
from kernelloop.engine.sampler import Sampler, TokenLogprobs, make_generator
from kernelloop.engine.sampling import SamplingParams
from kernelloop.engine.scheduler import ScheduledBatch, Scheduler, SchedulerConfig
from kernelloop.engine.tokenizer import Tokenizer
from kernelloop.engine.weights import init_random_weights, load_weights
from kernelloop.kernels.device import CPU, Device
from kernelloop.kernels.dispatch import Dispatcher
from kernelloop.kernels.registry import Registry

log = logging.getLogger(__name__)


class InvalidRequest(EngineError):
    """The request cannot be served as asked (e.g. prompt too long); the server answers 400."""


@dataclass(frozen=True)
class EngineConfig:
    model: str | None = None  # HF-format directory or a known name (smollm2); None: the embedded model
    device: Device = CPU  # a name ("cpu", "cuda") is turned into its Device
    dtype: str = "auto"  # auto | float32 | bfloat16 | float16
    kernels: str = "reference"  # reference | baseline | registry
    registry: str | None = None  # registry path (kernels=registry); None: the default registry
    fallback: str = "baseline"  # baseline | reference: what serves an op no registry entry covers
    deterministic: bool = False  # only batch-invariant kernel variants (kernels/deterministic.py)
    kv_cache_bytes: int | None = None  # None: 256 MiB on CPU, 85% of free memory on a GPU
    max_context: int | None = None  # None: the model's max positions, at most 8192
    prefix_cache: bool = True
    cuda_graphs: bool = True  # decode through captured CUDA graphs (CUDA devices only)
    random_weights: bool = False  # benchmark shapes without a checkpoint: seeded random weights
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)

    def __post_init__(self) -> None:
        object.__setattr__(self, "device", Device.of(self.device))


@dataclass
class StepOutput:
    """What one step produced for one request (streamed to its client)."""

    rid: str
    token_ids: list[int]
    text: str
    logprobs: list[TokenLogprobs | None]
    finished: bool
    finish_reason: str | None


class Engine:
    def __init__(self, config: EngineConfig = EngineConfig(), registry: Registry | None = None):
        """`registry`: the caller's Registry object for `config.registry` (with kernels="registry"), so that one
        process holds one; None builds it from the path."""
        self.config = config
        self.model_dir = resolve_model_dir(config.model)
        self.model_config = read_config(self.model_dir)
        self.tokenizer = Tokenizer.from_dir(self.model_dir)
        self.device = config.device.torch
        if self.device.type == "cpu":
            keep_freed_memory()  # large per-layer buffers stay in the heap (engine/cpu_allocator.py)
        self.dtype = resolve_dtype(config.dtype, self.model_config, config.device)
        self.max_context = _max_context(config.max_context, self.model_config)  # before the weights: fail fast
        self.model = build_model(self.model_config, self.dtype, self.device)
        if config.random_weights:
            init_random_weights(self.model)
        else:
            load_weights(self.model, self.model_dir)
        if config.kernels != "registry":
            registry = None
        elif registry is None:
            registry = Registry(config.registry)
        self.kernels = Dispatcher(config.kernels, registry=registry, device=config.device,
                                  fallback=config.fallback, deterministic=config.deterministic)
        sched = config.scheduler
        if config.deterministic and sched.mixed:
            # A decode row in a mixed step goes through extend_attention, not the invariant decode path.
            sched = dataclasses.replace(sched, mixed=False)
        num_slots = self._kv_slots()
        # The most tokens one request can have (prompt + output): /v1/models reports it.
        self.max_model_len = _max_model_len(config.max_context, self.max_context, num_slots)
        self.pool = KVPool(self.model_config, num_slots, self.dtype, self.device)
        self.allocator = SlotAllocator(num_slots)
        self.rows = RequestSlots(sched.max_running_requests + 1, self.max_context)
        self.cache = RadixCache(self.allocator.free, disabled=not config.prefix_cache)
        self.scheduler = Scheduler(sched, self.allocator, self.rows, self.cache)
        self.sampler = Sampler()
        # Deterministic mode's row-by-row variants read request lengths on the host: not capturable.
        graphs = self.device.type == "cuda" and config.cuda_graphs and not config.deterministic
        self.graphs = self._capture_graphs() if graphs else None
        self.requests: dict[str, Request] = {}
        self._detokenizers: dict[str, IncrementalDetokenizer] = {}
        self._ids = itertools.count()
        self.stats = {"prompt_tokens": 0, "cached_prompt_tokens": 0, "generated_tokens": 0, "forwards": 0}
        self.recorder: Recorder | None = None
        # Quality gates: called after each forward with (requests sampled, their float32 logits [B, vocab]).
        self.logits_hook: Callable[[list[Request], torch.Tensor], None] | None = None

    # -- requests ----------------------------------------------------------------------------

    def add_request(self, prompt_ids: list[int], params: SamplingParams, rid: str | None = None) -> Request:
        if not prompt_ids:
            raise InvalidRequest("the prompt is empty")
        if any(not 0 <= t < self.model_config.vocab_size for t in prompt_ids):
            raise InvalidRequest(f"prompt token ids must be in [0, {self.model_config.vocab_size})")
        capacity = self.max_model_len
        if len(prompt_ids) >= capacity:
            raise InvalidRequest(f"the prompt has {len(prompt_ids)} tokens; this engine serves at most {capacity - 1}")
        rid = rid or f"req-{next(self._ids)}"
        req = Request(rid=rid, prompt_ids=list(prompt_ids), params=params,
                      max_new_tokens=min(params.max_tokens, capacity - len(prompt_ids)),
                      generator=make_generator(params.seed, self.device))
        self.requests[rid] = req
        self._detokenizers[rid] = IncrementalDetokenizer(self.tokenizer.decode, params.stop, prompt_ids)
        self.scheduler.add(req)
        self.stats["prompt_tokens"] += len(prompt_ids)
        return req

    def abort(self, rid: str) -> None:
        req = self.requests.pop(rid, None)
        if req is not None and not req.finished:
            self.scheduler.finish(req, "abort")
        self._detokenizers.pop(rid, None)

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    # -- stepping ----------------------------------------------------------------------------

    def step(self) -> list[StepOutput]:
        """Run one forward (prefill or decode) and return what it produced."""
        if self.recorder is None:
            return self._step(None)
        with self.recorder.region(STEP):
            return self._step(self.recorder)

    def _step(self, rec: Recorder | None) -> list[StepOutput]:
        outputs = [self._finished_output(r, []) for r in self._drain_stopped()]
        with region(rec, SCHEDULE):
            batch = self.scheduler.schedule()
            forward_batch = self._forward_batch(batch) if batch is not None else None
        if batch is None:
            return outputs
        with region(rec, FORWARD):
            if rec is None and self.graphs is not None and self.graphs.can_run(forward_batch):
                logits = self.graphs.run(forward_batch)  # graphs hide per-op times: eager while profiling
            else:
                logits = self.model.forward(forward_batch, self.pool, self.kernels)
        self.stats["forwards"] += 1
        self.scheduler.advance(batch)
        sampled = [i for i, s in enumerate(batch.samples) if s]
        if not sampled:
            return outputs
        reqs = [batch.requests[i] for i in sampled]
        if self.logits_hook is not None:
            self.logits_hook(reqs, logits[sampled])
        with region(rec, SAMPLE):
            result = self.sampler.sample(logits[sampled], [r.params for r in reqs], [r.generator for r in reqs])
            tokens = result.tokens.tolist()
        for req, token, lp in zip(reqs, tokens, result.logprobs):
            outputs.append(self._accept(req, token, lp))
        return outputs

    def generate(self, prompts: list[list[int]], params: SamplingParams | list[SamplingParams]) -> list[Request]:
        """Serve `prompts` to completion (offline use and tests); returns the finished requests."""
        plist = params if isinstance(params, list) else [params] * len(prompts)
        reqs = [self.add_request(p, sp) for p, sp in zip(prompts, plist)]
        while any(not r.finished for r in reqs):
            self.step()
        for r in reqs:
            self.requests.pop(r.rid, None)
        return reqs

    def start_recording(self, trace: bool = False) -> None:
        """Time every step's regions and every op call until `stop_recording()` (between steps)."""
        rec = Recorder(self.config.device, trace=trace, dispatcher=self.kernels)
        self.recorder = rec
        self.kernels.observer = rec.op
        self._stats_at_start = dict(self.stats)

    def stop_recording(self) -> dict:
        """The recorder's raw seconds plus the engine counters over the recording (see engine/recorder.py)."""
        rec = self.recorder
        if rec is None:
            return {}
        self.recorder = None
        self.kernels.observer = None
        raw = rec.collect()
        raw["counters"] = {k: v - self._stats_at_start.get(k, 0) for k, v in self.stats.items()}
        raw["variants"] = self.kernels.variants_in_use()
        return raw

    def reload_kernels(self, revision: str | None = None) -> dict:
        """Re-read the kernel registry (its HEAD, or commit `revision`) between steps; returns the
        variants that changed. A change invalidates the prefix cache: a prompt served after it (the
        gate's after-measurement, or anything after a rollback) is computed by the kernels now served."""
        changed = self.kernels.reload(revision)
        if changed:
            self.cache.invalidate()  # cached KV was computed by the kernels replaced: never reuse it
            if self.graphs is not None:
                self.graphs = self._capture_graphs()  # graphs hold the kernels they were captured with
        return changed

    def kv_usage(self) -> float:
        """Share of KV slots held by requests or the prefix cache."""
        total = self.allocator.num_slots - 1
        return 1.0 - self.allocator.available() / total

    # -- internals ---------------------------------------------------------------------------

    def _forward_batch(self, batch: ScheduledBatch) -> ForwardBatch:
        ids, slots = [], []
        for req, start, n in zip(batch.requests, batch.starts, batch.lengths):
            ids.append(req.all_ids[start:start + n])
            slots.append(self.rows.read(req.row, start + n))
        mode = "decode" if batch.mode == "decode" else "extend"  # a mixed step's decode rows are 1-token extends
        return ForwardBatch.build(mode, ids, batch.starts, slots, self.device)

    def _accept(self, req: Request, token: int, logprobs: TokenLogprobs | None) -> StepOutput:
        if req.first_token_at is None:
            req.first_token_at = time.perf_counter()
            self.stats["cached_prompt_tokens"] += req.cached_tokens
        req.output_ids.append(token)
        req.logprobs.append(logprobs)
        self.stats["generated_tokens"] += 1
        detok = self._detokenizers[req.rid]
        text = detok.push(token)
        reason = None
        if detok.stopped:
            reason, req.stop_text = "stop", detok.stop_reason
        elif (token in self.tokenizer.eos_token_ids and not req.params.ignore_eos) or token in req.params.stop_token_ids:
            reason = "stop"
        elif len(req.output_ids) >= req.max_new_tokens:
            reason = "length"
        if reason is None:
            return StepOutput(req.rid, [token], text, [logprobs], False, None)
        self.scheduler.finish(req, reason)
        return self._finished_output(req, [token], text, [logprobs])

    def _finished_output(self, req: Request, tokens: list[int], text: str = "",
                         logprobs: list | None = None) -> StepOutput:
        req.finished_at = time.perf_counter()
        detok = self._detokenizers.pop(req.rid, None)
        if detok is not None and not detok.stopped:
            text += detok.flush()  # text held back in case it began a stop string
        return StepOutput(req.rid, tokens, text, logprobs or [], True, req.finish_reason)

    def _drain_stopped(self) -> list[Request]:
        stopped, self.scheduler.stopped = self.scheduler.stopped, []
        return stopped

    def _capture_graphs(self) -> DecodeGraphs | None:
        graphs = DecodeGraphs(self.model, self.pool, self.kernels, self.config.scheduler.max_running_requests,
                              self.allocator.num_slots)
        try:
            graphs.capture()
        except Exception:  # e.g. a kernel that syncs with the host: run eagerly rather than not at all
            log.exception("CUDA graph capture failed; decoding eagerly")
            return None
        return graphs

    def _kv_slots(self) -> int:
        budget = self.config.kv_cache_bytes
        if budget is None:
            if self.device.type == "cuda":
                free, _ = torch.cuda.mem_get_info(self.device)
                budget = int(free * 0.85)
            else:
                budget = 256 << 20
        slots = slots_for_budget(self.model_config, budget, self.dtype)
        # More than every running request at full context is never needed.
        cap = self.config.scheduler.max_running_requests * self.max_context + 1
        return max(2, min(slots, cap))


def _embedded_model_dir() -> Path:
    return resolve_model_dir(None)


def _max_context(asked: int | None, model: ModelConfig) -> int:
    """The context window: `asked` (EngineConfig.max_context, the CLI's --max-model-len), else the
    model's positions, at most 8192. Asking for more than the model's positions is an error."""
    positions = model.max_position_embeddings
    if asked is None:
        return min(8192, positions)
    if asked < 2:
        raise EngineError(f"max model length (--max-model-len) must be at least 2, not {asked}")
    if asked > positions:
        raise EngineError(f"max model length (--max-model-len) {asked} is more than the model's {positions} "
                          "positions (max_position_embeddings)")
    return asked


def _max_model_len(asked: int | None, context: int, num_slots: int) -> int:
    """What one request can really have: the context window, unless the KV cache holds fewer tokens
    (slot 0 is reserved). An explicit `asked` the cache cannot hold is an error; the default is
    lowered with a warning."""
    n = min(context, num_slots - 1)
    if n < context:
        if asked is not None:
            raise EngineError(f"max model length (--max-model-len) {asked} does not fit the KV cache, which holds "
                              f"{num_slots - 1} tokens; give it more memory (--kv-cache-mb) or ask for less")
        log.warning("the KV cache holds %d tokens, fewer than the %d-token context: requests are limited to %d "
                    "tokens (prompt + output); --kv-cache-mb gives it more memory", num_slots - 1, context, n)
    return n
