"""The shadow audit's routes: `GET /audit/samples?since=N` and `POST /audit/results`.

`GET /audit/samples?since=N` answers {"instance", "rate", "samples": [sample...], "next", "missed", "latest"}
(engine/audit_queue.py AuditQueue.since). `POST /audit/results` takes the auditor's per-commit figures,
{"commits": {commit: {"samples", "agreement", "kl", "loop_rate", "json_valid"}}, "rolled_back": [{"commit",
"reason"}]}, which `/metrics` shows as kernelloop_audit_* gauges. With `--audit-rate 0` the queue stays
empty and both routes still answer.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter
from fastapi import Request as HTTPRequest

from kernelloop.engine.audit_queue import AuditQueue, asks_for_json
from kernelloop.engine.engine import StepOutput
from kernelloop.engine.openai_api import APIError, parse_body

MAX_SAMPLES_PER_READ = 64


def router(queue: AuditQueue) -> APIRouter:
    routes = APIRouter()

    @routes.get("/audit/samples")
    async def samples(since: int = 0) -> dict[str, Any]:
        if since < 0:
            raise APIError(400, "since: a cursor of 0 or more", param="since")
        found, next_cursor, missed, latest = queue.since(since)
        found = found[:MAX_SAMPLES_PER_READ]
        if found:
            next_cursor = found[-1].seq + 1
        return {"instance": queue.instance, "rate": queue.rate, "samples": [s.to_json() for s in found],
                "next": next_cursor, "missed": missed, "latest": latest}

    @routes.post("/audit/results")
    async def results(http: HTTPRequest) -> dict[str, Any]:
        body = await asyncio.to_thread(parse_body, await http.body())
        if (not isinstance(body, dict) or not isinstance(body.get("commits", {}), dict)
                or not isinstance(body.get("rolled_back", []), list)):
            raise APIError(400, 'the body must be a JSON object like {"commits": {commit: {...}}, "rolled_back": []}')
        queue.post_results(body)
        return {"ok": True}

    return routes


def sample(queue: AuditQueue | None, engine: Any, body: Any, prompt_ids: list[int], out: StepOutput,
           tokens: list[int] | None = None, logprobs: list | None = None) -> None:
    """Called once per finished request: add it to `queue` when the seeded draw admits it. The commit is
    the one the engine serves as the request finishes (a reload mid-request is rare; the gate pins it)."""
    if queue is None or not queue.admit():
        return
    served = out.token_ids if tokens is None else tokens
    queue.add(out.rid, prompt_ids, served, out.logprobs if logprobs is None else logprobs,
              engine.kernels.commit, body.temperature == 0, asks_for_json(body))
