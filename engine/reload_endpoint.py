"""`POST /kernels/reload`: re-read the kernel registry between engine steps.

Body (optional): {"revision": "<registry commit>"} serves the registry as that commit holds it,
which is how the end-to-end gate alternates the kernels before and after a commit; no body (or no
revision) serves the registry's HEAD. Reply: {"changed": {op: {"dtype bucket": [old, new]}},
"revision": the commit pinned or null, "registry_error": the registry's last read error or null}.
"""

from __future__ import annotations

import json
from typing import Any

from kernelloop.common.errors import RegistryError
from kernelloop.engine.loop import EngineLoop
from kernelloop.engine.openai_api import APIError


def parse_revision(raw: bytes) -> str | None:
    if not raw.strip():
        return None
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):
        raise APIError(400, "the body must be a JSON object like {\"revision\": \"<commit>\"}") from None
    if not isinstance(body, dict):
        raise APIError(400, "the body must be a JSON object like {\"revision\": \"<commit>\"}")
    revision = body.get("revision")
    if revision is not None and (not isinstance(revision, str) or not revision.strip()
                                 or len(revision) > 100 or revision.startswith("-")):
        raise APIError(400, "revision: a registry commit (sha, or a ref like HEAD~1)", param="revision")
    return revision


async def reload(loop: EngineLoop, raw: bytes) -> dict[str, Any]:
    revision = parse_revision(raw)
    engine = loop.engine

    def run() -> dict[str, Any]:
        try:
            changed = engine.reload_kernels(revision)
        except RegistryError as exc:
            raise APIError(400, str(exc), param="revision") from None
        return {"changed": changed, "revision": engine.kernels.revision, "registry_error": engine.kernels.registry_error}

    return await loop.call(run)
