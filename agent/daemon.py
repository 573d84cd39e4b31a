"""The optimisation daemon: profile, tune, commit, verify, sleep; again, until stopped or out of budget.

SIGTERM (or SIGINT) asks it to stop: the tune in progress stops at its next step boundary (its
checkpoint is already written, so the next start resumes it), a sleep ends at once, and the
process exits 0. A crash is the same as a stop without the courtesy: the next start resumes.
`/metrics` serves Prometheus text while it runs. With an `auditor` (agent/auditor.py), the daemon runs the
shadow audit of the engine's live traffic every `audit_every_s` while it sleeps between runs (and, with
`tune=False`, does nothing else): a commit that breaches is rolled back there.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

from kernelloop.agent.loop.context import LoopContext
from kernelloop.agent.loop.graph import run_tune, unfinished_run
from kernelloop.agent.loop.state import TuneSettings
from kernelloop.common.progress import takes_every_step

log = logging.getLogger("kernelloop.daemon")


class Stopping(Exception):
    """Raised at a step boundary once a stop was requested."""


@dataclass
class DaemonMetrics:
    state: str = "starting"
    runs: dict[str, int] = field(default_factory=dict)
    last_run_at: float = 0.0
    last_op: str = ""
    audits: int = 0
    audit_rollbacks: int = 0
    judges: Callable[[], list[Any]] | None = None  # --cluster: the pool's actors() (sandbox/cluster ActorInfo)

    def render(self) -> str:
        lines = ["# TYPE kernelloop_daemon_up gauge", "kernelloop_daemon_up 1",
                 "# TYPE kernelloop_daemon_state gauge"]
        lines += [f'kernelloop_daemon_state{{state="{s}"}} {int(self.state == s)}' for s in ("starting", "tuning", "sleeping", "stopping")]
        lines += ["# TYPE kernelloop_daemon_runs_total counter"]
        lines += [f'kernelloop_daemon_runs_total{{status="{k}"}} {v}' for k, v in sorted(self.runs.items())]
        lines += ["# TYPE kernelloop_daemon_last_run_timestamp_seconds gauge",
                  f"kernelloop_daemon_last_run_timestamp_seconds {self.last_run_at:.0f}",
                  "# TYPE kernelloop_daemon_audits_total counter", f"kernelloop_daemon_audits_total {self.audits}",
                  "# TYPE kernelloop_daemon_audit_rollbacks_total counter",
                  f"kernelloop_daemon_audit_rollbacks_total {self.audit_rollbacks}"]
        return "\n".join(lines + self._judge_lines()) + "\n"

    def _judge_lines(self) -> list[str]:
        """Per-actor gauges of a cluster pool: busy, checks done, failures (as ActorInfo counts them)."""
        if self.judges is None:
            return []
        actors = self.judges()
        out: list[str] = []
        for name, kind, value in (("busy", "gauge", lambda a: int(a.busy)), ("checks_total", "counter", lambda a: a.checks),
                                  ("failures_total", "counter", lambda a: a.failures)):
            out.append(f"# TYPE kernelloop_judge_{name} {kind}")
            out += [f'kernelloop_judge_{name}{{actor="{a.index}",node="{_label(a.node)}",device="{_label(a.device)}"}} '
                    f"{value(a)}" for a in actors]
        return out


def _label(value: str) -> str:
    """A Prometheus label value, escaped."""
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def serve_metrics(metrics: DaemonMetrics, port: int, host: str = "127.0.0.1") -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:  # noqa: N802
            body = metrics.render().encode() if self.path == "/metrics" else b"not found\n"
            self.send_response(200 if self.path == "/metrics" else 404)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer((host, port), Handler)
    threading.Thread(target=server.serve_forever, name="daemon-metrics", daemon=True).start()
    return server


class Daemon:
    def __init__(self, ctx: LoopContext, settings: TuneSettings, *, interval_s: float, max_runs: int | None,
                 max_seconds: float | None, metrics: DaemonMetrics, auditor: Any = None,
                 audit_every_s: float = 60.0, tune: bool = True) -> None:
        self.ctx, self.settings = ctx, settings
        self.auditor, self.audit_every_s, self.tune = auditor, audit_every_s, tune
        self.interval_s, self.max_runs, self.max_seconds = interval_s, max_runs, max_seconds
        self.metrics = metrics
        self._stop = threading.Event()
        user_progress = ctx.progress
        ctx.progress = self._progress(user_progress)

    def _progress(self, inner: Callable[[str], None]) -> Callable[[str], None]:
        def progress(message: str) -> None:
            if self._stop.is_set():
                raise Stopping()
            inner(message)
        progress.takes_every_step = takes_every_step(inner)  # type: ignore[attr-defined]  # still a terminal's bars
        return progress

    def request_stop(self, *_: Any) -> None:
        log.info("stop requested: finishing the current step")
        self.metrics.state = "stopping"
        self._stop.set()

    def install_signal_handlers(self) -> None:
        signal.signal(signal.SIGTERM, self.request_stop)
        signal.signal(signal.SIGINT, self.request_stop)

    def _budget_spent(self, started: float, finished: int) -> bool:
        if self.max_runs is not None and finished >= self.max_runs:
            log.info("run budget spent (%d runs)", finished)
            return True
        if self.max_seconds is not None and time.monotonic() - started >= self.max_seconds:
            log.info("time budget spent")
            return True
        return False

    def audit(self) -> None:
        """One shadow-audit poll; a failure is logged, never fatal (the engine may be restarting)."""
        try:
            result = self.auditor.poll()
        except Exception as exc:  # noqa: BLE001  the daemon outlives a bad poll
            log.error("shadow audit failed: %s", str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
            return
        self.metrics.audits += 1
        self.metrics.audit_rollbacks += len(result.rolled_back)
        for rolled in result.rolled_back:
            log.warning("shadow audit rolled back %s: %s", rolled["commit"][:10], rolled["reason"])
        if result.scored:
            log.info("shadow audit scored %d requests", result.scored)

    def sleep(self, seconds: float, until: float | None = None) -> None:
        """Wait `seconds` (or until the monotonic time `until`, if sooner), auditing every audit_every_s."""
        deadline = time.monotonic() + seconds
        if until is not None:
            deadline = min(deadline, until)
        while not self._stop.is_set():
            if self.auditor is not None:
                self.audit()
            left = deadline - time.monotonic()
            if left <= 0:
                return
            wait = min(left, self.audit_every_s) if self.auditor is not None else left
            self._stop.wait(None if wait == float("inf") else wait)

    def run(self) -> int:
        """Tune until stopped or out of budget; returns the number of runs that finished."""
        started, finished = time.monotonic(), 0
        if not self.tune:
            self.metrics.state = "sleeping"
            until = started + self.max_seconds if self.max_seconds is not None else None
            self.sleep(float("inf"), until)
            self.metrics.state = "stopping"
            return 0
        while not self._stop.is_set() and not self._budget_spent(started, finished):
            self.metrics.state = "tuning"
            try:
                state = run_tune(self.settings, self.ctx, resume=unfinished_run(self.ctx, self.settings.op))
            except Stopping:
                log.info("stopped between two steps; the run resumes at the next start")
                break
            finished += 1
            status = state.get("status", "failed")
            self.metrics.runs[status] = self.metrics.runs.get(status, 0) + 1
            self.metrics.last_run_at, self.metrics.last_op = time.time(), state.get("op", "")
            log.info("run %s on %s: %s (%s)", state.get("run_id"), state.get("op"), status, state.get("reason"))
            if self._budget_spent(started, finished):
                break
            self.metrics.state = "sleeping"
            self.sleep(self.interval_s)
        self.metrics.state = "stopping"
        return finished
