"""A real engine server (uvicorn in a thread, a free port) for tests that talk HTTP to it."""

from __future__ import annotations

import socket
import threading
import time
from contextlib import contextmanager
from typing import Iterator

import httpx

from kernelloop.engine.audit_queue import AuditQueue
from kernelloop.engine.engine import Engine
from kernelloop.engine.loop import EngineLoop
from kernelloop.engine.server import create_app


@contextmanager
def serve(engine: Engine, model_name: str, audit: AuditQueue | None = None) -> Iterator[tuple[str, EngineLoop]]:
    """Yields (base URL, loop) once /health answers; stops server and loop afterwards. `audit`: the shadow
    audit's queue (default: none sampled)."""
    import uvicorn

    loop = EngineLoop(engine).start()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    srv = uvicorn.Server(uvicorn.Config(create_app(loop, model_name, audit=audit), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            if httpx.get(f"{base}/health", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.1)
    try:
        yield base, loop
    finally:
        srv.should_exit = True
        thread.join(10)
        loop.stop()
