"""Three agents that know nothing of Python's zettelq client share one memory over HTTP.

Each agent stands for a service in any language: it speaks plain JSON over HTTP with a bearer
token (here with nothing but the standard library). The scout and the analyst write what they
find, fire-and-forget (202 at once, no waiting on organisation); the writer then searches the
shared namespace and drafts its summary only from what the others stored.

Run it against `zettelq serve` with a worker running (`zettelq dev`):

    TOKEN=$(zettelq token create --read mission --write mission --json \\
            | python3 -c 'import json, sys; print(json.load(sys.stdin)["secret"])')
    ZETTELQ_URL=http://127.0.0.1:8080 ZETTELQ_TOKEN=$TOKEN python examples/http_agents.py
"""

from __future__ import annotations

import json
import os
import urllib.request
from typing import Any

NAMESPACE = "mission"


def call(method: str, path: str, body: dict[str, Any] | None = None) -> Any:
    """One request to the HTTP API; the JSON answer."""
    request = urllib.request.Request(
        os.environ["ZETTELQ_URL"] + path,
        data=None if body is None else json.dumps(body).encode(),
        method=method,
        headers={
            "Authorization": f"Bearer {os.environ['ZETTELQ_TOKEN']}",
            "Content-Type": "application/json",
        },
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.load(response)


def remember(agent: str, content: str, tags: list[str]) -> str:
    """Store a note as ``agent``; returns its id as soon as it is queued."""
    body = {"content": content, "agent": agent, "tags": tags}
    return str(call("POST", f"/v1/namespaces/{NAMESPACE}/notes", body)["id"])


def recall(query: str, k: int = 5) -> list[dict[str, Any]]:
    hits = call("POST", f"/v1/namespaces/{NAMESPACE}/search", {"query": query, "k": k})["hits"]
    return list(hits)


def scout() -> None:
    remember("scout", "The rover found water ice in the shadow of crater Shackleton.", ["ice"])
    remember("scout", "The crater rim gets sunlight for 80 percent of the lunar day.", ["sun"])


def analyst() -> None:
    remember(
        "analyst",
        "Water ice near a sunlit rim makes Shackleton the best site for the base.",
        ["site"],
    )


def writer() -> str:
    """The summary, from the others' memories only: the writer was told nothing directly."""
    found = recall("best site for the base water ice sunlight")
    by = sorted({hit["agent"] for hit in found})
    lines = [f"- {hit['content']} ({hit['agent']})" for hit in found]
    return f"Summary from the memories of {', '.join(by)}:\n" + "\n".join(lines)


def main() -> None:
    scout()
    analyst()
    print(writer())


if __name__ == "__main__":
    main()
