"""The GitHub side of `agent pr`: the repository slug of a remote URL, and opening the pull request
through the REST API (POST /repos/{owner}/{name}/pulls). Errors are PrError, one line."""

from __future__ import annotations

import re
from typing import Any

import httpx

from kernelloop.common.errors import KernelloopError

DEFAULT_GITHUB_API = "https://api.github.com"
GITHUB_TIMEOUT_S = 30.0


class PrError(KernelloopError):
    """A proposal could not be made (or its pull request not opened); the message is one line."""


def one_line(text: Any) -> str:
    return " ".join(str(text).split())


_GITHUB_URL = re.compile(r"^(?:https?://(?:[^@/]+@)?github\.com/|ssh://(?:[^@/]+@)?github\.com(?::\d+)?/|"
                         r"(?:[^@/]+@)?github\.com:)([A-Za-z0-9_.-]+)/([A-Za-z0-9_.-]+?)(?:\.git)?/?$")


def github_slug(url: str | None) -> str | None:
    """"owner/name" of a github.com remote URL (https, ssh or scp-like), else None."""
    m = _GITHUB_URL.match((url or "").strip())
    return f"{m.group(1)}/{m.group(2)}" if m else None


def check_slug(slug: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+", slug):
        raise PrError(f"--github-repo must be OWNER/NAME, not {slug!r}")
    return slug


def open_pull_request(api: str, slug: str, token: str, *, title: str, head: str, base: str, body: str) -> str:
    """POST /repos/{slug}/pulls; the new pull request's html_url. Errors: PrError, one line."""
    url = f"{api.rstrip('/')}/repos/{slug}/pulls"
    headers = {"Authorization": f"Bearer {token}", "Accept": "application/vnd.github+json",
               "X-GitHub-Api-Version": "2022-11-28", "User-Agent": "kernelloop"}
    try:
        r = httpx.post(url, json={"title": title, "head": head, "base": base, "body": body},
                       headers=headers, timeout=GITHUB_TIMEOUT_S)
    except httpx.HTTPError as exc:
        raise PrError(f"GitHub API request to {url} failed ({type(exc).__name__}: {one_line(exc)})") from None
    try:
        data = r.json()
    except ValueError:
        data = None
    if not 200 <= r.status_code < 300:
        detail = ""
        if isinstance(data, dict):
            detail = str(data.get("message") or "")
            errors = [e.get("message") or e.get("code") for e in data.get("errors") or [] if isinstance(e, dict)]
            if any(errors):
                detail += " (" + "; ".join(str(e) for e in errors if e) + ")"
        raise PrError(one_line(f"GitHub API answered {r.status_code} {r.reason_phrase}: {detail or r.text[:200]}"))
    if not isinstance(data, dict) or not data.get("html_url"):
        raise PrError(f"GitHub API answered {r.status_code} without the pull request's html_url")
    return str(data["html_url"])
