"""EngineLoop: runs the single-threaded Engine in its own thread; the async server talks to it.

Everything that touches the engine (adding and aborting requests, kernel reload, profiling)
runs in the loop thread between two steps, so a reload swaps kernels atomically between batches
and no request is dropped. Outputs go back to each request's asyncio queue thread-safely.

The hand-off is what keeps HTTP serving close to in-process speed on few cores: one wake-up of
the event loop per step (not one per request), and a request that does not stream gets a single
merged output when it finishes instead of one per token (each wake-up costs the GIL and a core
that the engine's torch threads need).
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections import deque
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from kernelloop.engine.engine import Engine, StepOutput
from kernelloop.engine.sampling import SamplingParams

log = logging.getLogger(__name__)


@dataclass
class _Held:
    """Outputs of one request merged until they are due: at finish (`every` None: not streamed), or
    every `every` tokens after the first output, which is always sent at once (TTFT)."""

    every: int | None
    pending: StepOutput | None = None
    started: bool = False


class Arrival:
    """A request the server has begun to read and not yet added to the engine (`EngineLoop.arriving`):
    while one is open, a step that would admit a fresh arrival keeps waiting for it (within the window)."""

    def __init__(self, loop: "EngineLoop"):
        self._loop, self._open = loop, True
        with loop._arrivals_lock:
            loop._arriving += 1

    def close(self) -> None:
        """Idempotent; called from either thread (the engine's when it adds the request)."""
        with self._loop._arrivals_lock:
            if self._open:
                self._open = False
                self._loop._arriving -= 1


class EngineLoop:
    def __init__(self, engine: Engine, stream_interval: int = 1):
        if stream_interval < 1:
            raise ValueError(f"stream interval must be at least 1 token, not {stream_interval}")
        self.engine = engine
        self.stream_interval = stream_interval  # streamed requests get a chunk every this many tokens
        self._commands: queue.Queue[Callable[[], None]] = queue.Queue()
        self._sinks: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._held: dict[str, _Held] = {}  # requests whose outputs are merged before delivery
        self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)
        self._stop = threading.Event()
        self._recent: deque[tuple[float, int]] = deque()  # (time, tokens generated) per step, last 10 s
        self.step_hooks: list[Callable[[float, int], None]] = []  # called with (step seconds, tokens)
        self.error: str | None = None
        self._arriving = 0  # open Arrivals
        self._arrivals_lock = threading.Lock()

    def start(self) -> "EngineLoop":
        """Run the loop in its own thread (tests, embedding callers)."""
        self._thread.start()
        return self

    def run_here(self, keep_going: Callable[[], bool] = lambda: True) -> None:
        """Run the loop in the calling thread until stop() or until `keep_going()` turns false.

        `engine serve` runs it on the main thread (the HTTP server gets a thread): on CPU, torch ops
        run measurably slower (~15%) from a secondary thread than from the main one.
        """
        self._run(keep_going)

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    # -- called from the server's event loop ---------------------------------------------------

    @property
    def open_arrivals(self) -> int:
        return self._arriving

    @contextmanager
    def arriving(self) -> Iterator[Arrival]:
        """Open from the moment the server starts reading a request until it is added (pass it to `submit`)
        or refused, so the admission window knows more of a burst is on its way."""
        arrival = Arrival(self)
        try:
            yield arrival
        finally:
            arrival.close()

    async def submit(self, prompt_ids: list[int], params: SamplingParams,
                     prepare: Callable[[str], None] | None = None, stream: bool = True,
                     arrival: Arrival | None = None) -> tuple[str, asyncio.Queue]:
        """Add a request; its StepOutputs arrive on the returned queue. Raises what add_request raises.

        `prepare(rid)` runs in the loop thread right after the request is added, before any step.
        `stream=False`: the queue receives one output, all tokens merged, when the request finishes;
        streamed, the first output at once and then one every `stream_interval` tokens. `arrival` is
        closed in the loop thread as the request is added.
        """
        out: asyncio.Queue = asyncio.Queue()
        loop = asyncio.get_running_loop()

        def add() -> str:
            try:
                req = self.engine.add_request(prompt_ids, params)
            finally:
                if arrival is not None:
                    arrival.close()
            self._sinks[req.rid] = (loop, out)
            if not stream or self.stream_interval > 1:
                self._held[req.rid] = _Held(None if not stream else self.stream_interval)
            if prepare is not None:
                prepare(req.rid)
            return req.rid

        rid = await self.call(add)
        return rid, out

    def abort(self, rid: str) -> None:
        self._commands.put(lambda: self._abort(rid))

    async def call(self, fn: Callable[[], Any]) -> Any:
        """Run `fn` in the loop thread between two steps and return its result."""
        future: Future = Future()

        def run() -> None:
            try:
                future.set_result(fn())
            except BaseException as exc:  # handed to the caller
                future.set_exception(exc)

        self._commands.put(run)
        return await asyncio.wrap_future(future)

    def tokens_per_second(self) -> float:
        now = time.perf_counter()
        recent = [(t, n) for t, n in list(self._recent) if now - t <= 10.0]
        if not recent:
            return 0.0
        return sum(n for _, n in recent) / max(now - recent[0][0], 1.0)

    # -- the loop thread -----------------------------------------------------------------------

    def _run(self, keep_going: Callable[[], bool] = lambda: True) -> None:
        while not self._stop.is_set() and keep_going():
            self._drain_commands(block=not self.engine.has_work())
            if not self.engine.has_work():
                continue
            self._hold_for_burst()
            start = time.perf_counter()
            try:
                outputs = self.engine.step()
            except Exception as exc:  # a failed forward ends the affected requests, not the server
                log.exception("engine step failed")
                self.error = f"{type(exc).__name__}: {exc}"
                self._fail_all()
                continue
            elapsed = time.perf_counter() - start
            tokens = sum(len(o.token_ids) for o in outputs)
            now = time.perf_counter()
            self._recent.append((now, tokens))
            while self._recent and now - self._recent[0][0] > 10.0:
                self._recent.popleft()
            for hook in self.step_hooks:
                hook(elapsed, tokens)
            self._deliver(outputs)

    def _hold_for_burst(self) -> None:
        """Admission window: before a step that would admit a fresh arrival, take commands while more of
        its burst is coming: while the server is reading a request (an open Arrival), or until the gap has
        passed since the latest arrival; never past the window since the oldest one. So a burst spread over
        a few milliseconds lands in one prefill, and a lone request waits only the gap. Requests that waited
        before (retracted, or no room) do not hold the step."""
        config = self.engine.scheduler.config
        if config.admission_window <= 0:
            return
        fresh = self._fresh_arrivals()
        if not fresh:
            return
        deadline = min(fresh) + config.admission_window
        while not self._stop.is_set() and fresh:
            until = deadline if self._arriving > 0 else min(deadline, max(fresh) + config.admission_gap)
            if (left := until - time.perf_counter()) <= 0:
                return
            self._drain_commands(block=True, timeout=left)
            fresh = self._fresh_arrivals()  # a command may have added some, or aborted them all

    def _fresh_arrivals(self) -> list[float]:
        return [r.arrived_at for r in self.engine.scheduler.waiting if r.row is None and not r.output_ids
                and r.retractions == 0]

    def _drain_commands(self, block: bool, timeout: float = 0.05) -> None:
        try:
            command = self._commands.get(timeout=timeout) if block else self._commands.get_nowait()
        except queue.Empty:
            return
        while True:
            command()
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return

    def _deliver(self, outputs: list[StepOutput]) -> None:
        """Hand a step's outputs to their requests' queues: one thread-safe call per event loop."""
        batches: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue, StepOutput]]] = {}
        for output in outputs:
            held = self._held.get(output.rid)
            if held is not None:
                output = merge_outputs(held.pending, output)
                due = held.every is not None and (not held.started or len(output.token_ids) >= held.every)
                if not (output.finished or due):
                    held.pending = output
                    continue
                held.pending, held.started = None, True
                if output.finished:
                    del self._held[output.rid]
            sink = self._sinks.get(output.rid)
            if output.finished:
                self._sinks.pop(output.rid, None)
                self.engine.requests.pop(output.rid, None)
            if sink is not None:
                batches.setdefault(sink[0], []).append((sink[1], output))
        for loop, items in batches.items():
            loop.call_soon_threadsafe(_put_all, items)

    def _abort(self, rid: str) -> None:
        self._sinks.pop(rid, None)
        self._held.pop(rid, None)
        self.engine.abort(rid)

    def _fail_all(self) -> None:
        rids = list(self._sinks)
        for rid in rids:
            self.engine.abort(rid)
        self._deliver([StepOutput(rid, [], "", [], True, "abort") for rid in rids])


def merge_outputs(sofar: StepOutput | None, new: StepOutput) -> StepOutput:
    """`new` appended to `sofar` (a copy the loop owns, extended in place)."""
    if sofar is None:
        return StepOutput(new.rid, list(new.token_ids), new.text, list(new.logprobs), new.finished, new.finish_reason)
    sofar.token_ids += new.token_ids
    sofar.text += new.text
    sofar.logprobs += new.logprobs
    sofar.finished, sofar.finish_reason = new.finished, new.finish_reason
    return sofar


async def next_output(queue: asyncio.Queue) -> StepOutput:
    """The next output of a streamed request; when several are waiting (the server fell behind the
    engine), all of them merged into one, so a slow event loop sends fewer, larger chunks."""
    out = await queue.get()
    if out.finished or queue.empty():
        return out
    out = merge_outputs(None, out)
    while not out.finished and not queue.empty():
        merge_outputs(out, queue.get_nowait())
    return out


def _put_all(items: list[tuple[asyncio.Queue, StepOutput]]) -> None:
    for stream, output in items:
        stream.put_nowait(output)
