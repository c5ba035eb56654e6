"""The HTTP plumbing shared by the OpenAI-compatible clients (embeddings and chat): JSON
headers with an optional bearer key, and an opener that never follows redirects, so a key is
never re-sent to another host."""

from __future__ import annotations

import urllib.request
from email.message import Message
from typing import Any


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """Turn a redirect into an HTTPError instead of re-sending the key somewhere else."""

    def redirect_request(
        self,
        req: urllib.request.Request,
        fp: Any,
        code: int,
        msg: str,
        headers: Message,
        newurl: str,
    ) -> None:
        return None


def json_headers(api_key: str | None) -> dict[str, str]:
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    return headers


def opener() -> urllib.request.OpenerDirector:
    """An opener that refuses redirects."""
    return urllib.request.build_opener(_NoRedirect)
