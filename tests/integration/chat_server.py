"""A scripted OpenAI-compatible chat server on 127.0.0.1 for the LLM paths (no mock objects).

Each POST to ``/v1/chat/completions`` takes the next scripted reply (the last one repeats): a
JSON answer with usage, raw content that is not JSON, an HTTP error status, or a delay before
answering; a reply made by ``answer_with`` computes its JSON from the request's user prompt,
and when ``responder`` is set it computes each whole reply from the request. Every request body
is recorded.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest


@dataclass(frozen=True)
class Scripted:
    content: str = "{}"
    status: int = 200
    delay_s: float = 0.0
    tokens: int = 42
    build: Callable[[str], Any] | None = None  #: user prompt -> the JSON object to answer
    prompt_tokens: int = 0
    completion_tokens: int = 0


def answer(obj: Any, *, delay_s: float = 0.0) -> Scripted:
    return Scripted(json.dumps(obj), delay_s=delay_s)


def answer_with(build: Callable[[str], Any], *, delay_s: float = 0.0) -> Scripted:
    """A reply computed from each request's user prompt."""
    return Scripted(delay_s=delay_s, build=build)


class ChatServer:
    def __init__(self) -> None:
        self.script: list[Scripted] = [Scripted()]
        #: when set, computes each reply from the request body instead of the script
        self.responder: Callable[[dict[str, Any]], Scripted] | None = None
        self.requests: list[dict[str, Any]] = []
        self.release = threading.Event()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"

    def reply_with(self, *replies: Scripted) -> None:
        self.script = list(replies)

    def _next(self) -> Scripted:
        return self.script.pop(0) if len(self.script) > 1 else self.script[0]

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                request = {
                    "path": self.path,
                    "authorization": self.headers.get("Authorization"),
                    **json.loads(body),
                }
                server.requests.append(request)
                reply = server.responder(request) if server.responder else server._next()
                content = reply.content
                if reply.build is not None:
                    content = json.dumps(reply.build(request["messages"][1]["content"]))
                if reply.delay_s:
                    server.release.wait(reply.delay_s)
                if reply.status != 200:
                    self.send_error(reply.status)
                    return
                payload = json.dumps(
                    {
                        "choices": [{"message": {"role": "assistant", "content": content}}],
                        "usage": _usage(reply),
                    }
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        return Handler

    def start(self) -> ChatServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.release.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join()


def _usage(reply: Scripted) -> dict[str, int]:
    usage = {"total_tokens": reply.tokens}
    if reply.prompt_tokens or reply.completion_tokens:
        usage["prompt_tokens"] = reply.prompt_tokens
        usage["completion_tokens"] = reply.completion_tokens
    return usage


@pytest.fixture
def chat() -> Iterator[ChatServer]:
    srv = ChatServer().start()
    yield srv
    srv.stop()
