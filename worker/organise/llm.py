"""An OpenAI-compatible chat client for organisation work: ``ask_json`` sends one prompt to
``POST {llm_url}/chat/completions`` and returns the answer validated against a pydantic schema,
or None. Standard library only (urllib + json).

It fails closed. Any failure — the LLM is off, the namespace's hourly budget is spent, no call
slot frees up in time, a timeout or connection error, an HTTP error status, a body that is not
the chat-completions shape, content that is not one JSON object, an answer off the schema, or one
that names an id the prompt did not show — returns None, logs the reason and counts it in the
namespace's stats (``llm_failures`` and ``llm_fail_<reason>``). Callers then leave memory as it
was or fall back to their deterministic heuristic. Calls and tokens (the response's ``usage``)
are counted in the same hash (``llm_calls``, ``llm_tokens``, ``llm_prompt_tokens``,
``llm_completion_tokens``).

Prompts that show stored notes number them (``number_items``) and the schema refers to them
through ``ShownRef``: ``ask_json(..., shown=numbers)`` accepts only numbers that were shown, so
the model can never make the caller touch a note it did not see (the Agent Memory Atlas review of
A-MEM found it mapping list positions to the wrong notes).
"""

from __future__ import annotations

import http.client
import json
import logging
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Annotated, Any, TypeVar

from pydantic import AfterValidator, BaseModel, ValidationError, ValidationInfo

from worker import metrics
from worker.context import WorkerContext
from worker.errors import LLMFailure
from worker.models import openai_http
from worker.settings import WorkerSettings

log = logging.getLogger(__name__)

M = TypeVar("M", bound=BaseModel)

MAX_RESPONSE_BYTES = 4 << 20  #: a larger response body is refused
BUDGET_TTL_S = 7_200  #: an hour's budget counter outlives its hour by one more
UNKNOWN_ID = "unknown id"  #: the message ShownRef fails with
SYSTEM_PROMPT = (
    "You organise a note memory. Answer with exactly one JSON object and nothing else. "
    "It must validate against this JSON schema: %s"
)


def _check_shown(value: int, info: ValidationInfo) -> int:
    shown = (info.context or {}).get("shown", ())
    if value not in shown:
        raise ValueError(UNKNOWN_ID)
    return value


#: A prompt item's number in an answer schema; valid only if ask_json(shown=...) holds it.
ShownRef = Annotated[int, AfterValidator(_check_shown)]


def number_items(ids: Sequence[str]) -> dict[int, str]:
    """Prompt numbers (1, 2, ...) for stable ids, to show the model instead of the ids."""
    return {n: nid for n, nid in enumerate(ids, start=1)}


@dataclass(frozen=True)
class Answer:
    """The content of a chat completion and the tokens it cost (total, prompt, completion)."""

    content: str
    tokens: int
    prompt_tokens: int = 0
    completion_tokens: int = 0


class ChatClient:
    """Blocking chat-completions calls with at most ``max_concurrent`` in flight."""

    def __init__(
        self, url: str, model: str, api_key: str | None, timeout_s: float, max_concurrent: int
    ) -> None:
        self.url = url.rstrip("/") + "/chat/completions"
        self.model = model
        self.timeout_s = timeout_s
        self._slots = threading.BoundedSemaphore(max_concurrent)
        self._headers = openai_http.json_headers(api_key)
        self._opener = openai_http.opener()

    def complete(self, system: str, prompt: str) -> Answer:
        """One call in JSON mode; raise LLMFailure when it yields no content."""
        if not self._slots.acquire(timeout=self.timeout_s):
            raise LLMFailure("busy", f"no call slot freed within {self.timeout_s:.1f}s")
        try:
            payload = self._post(self._body(system, prompt))
        finally:
            self._slots.release()
        return _parse_completion(payload)

    def _body(self, system: str, prompt: str) -> bytes:
        return json.dumps(
            {
                "model": self.model,
                "messages": [
                    {"role": "system", "content": system},
                    {"role": "user", "content": prompt},
                ],
                "temperature": 0,
                "response_format": {"type": "json_object"},
            }
        ).encode()

    def _post(self, body: bytes) -> Any:
        request = urllib.request.Request(self.url, data=body, headers=self._headers, method="POST")
        try:
            with self._opener.open(request, timeout=self.timeout_s) as response:
                raw = response.read(MAX_RESPONSE_BYTES + 1)
        except urllib.error.HTTPError as exc:
            exc.close()
            raise LLMFailure("http", f"{self.url} answered {exc.code} {exc.reason}") from exc
        except TimeoutError as exc:
            raise LLMFailure("timeout", f"{self.url} took over {self.timeout_s:.1f}s") from exc
        except (OSError, http.client.HTTPException) as exc:  # URLError, resets
            if isinstance(getattr(exc, "reason", None), TimeoutError):
                raise LLMFailure("timeout", f"{self.url}: {exc}") from exc
            raise LLMFailure("unreachable", f"{self.url}: {exc}") from exc
        if len(raw) > MAX_RESPONSE_BYTES:
            raise LLMFailure("response", f"{self.url} sent over {MAX_RESPONSE_BYTES} bytes")
        try:
            return json.loads(raw)
        except ValueError as exc:
            raise LLMFailure("response", f"{self.url} did not answer with JSON") from exc


def _parse_completion(payload: Any) -> Answer:
    """The first choice's content and the total tokens of a chat-completions response."""
    try:
        content = payload["choices"][0]["message"]["content"]
    except (KeyError, IndexError, TypeError) as exc:
        raise LLMFailure("response", "no choices[0].message.content") from exc
    if not isinstance(content, str):
        raise LLMFailure("response", "message content is not text")
    usage = payload.get("usage") if isinstance(payload, dict) else None
    counts = usage if isinstance(usage, dict) else {}
    tokens, prompt, completion = (
        n if isinstance(n := counts.get(name, 0), int) else 0
        for name in ("total_tokens", "prompt_tokens", "completion_tokens")
    )
    return Answer(content, tokens, prompt, completion)


@lru_cache(maxsize=8)
def _client(
    url: str, model: str, api_key: str | None, timeout_s: float, max_concurrent: int
) -> ChatClient:
    """One client per configuration and process, so its call slots are shared."""
    return ChatClient(url, model, api_key, timeout_s, max_concurrent)


def client_for(settings: WorkerSettings) -> ChatClient | None:
    """This process's chat client for ``settings``, or None when the LLM is off."""
    if settings.llm_url is None:
        return None
    key = settings.llm_api_key.get_secret_value() if settings.llm_api_key else None
    return _client(
        settings.llm_url,
        settings.llm_model,
        key,
        settings.llm_timeout_s,
        settings.llm_max_concurrent,
    )


def ask_json(
    ctx: WorkerContext,
    ns: str,
    prompt: str,
    schema: type[M],
    *,
    shown: Collection[int] = (),
    purpose: str | None = None,
) -> M | None:
    """The model's answer to ``prompt`` as a ``schema`` instance, or None (LLM off, or any
    failure: see the module docstring). ``shown`` holds the item numbers ShownRef accepts;
    a ``purpose`` also counts the call and its tokens as ``<purpose>_calls`` and
    ``<purpose>_tokens``."""
    chat = client_for(ctx.settings)
    if chat is None:
        return None
    started = time.perf_counter()
    try:
        _spend_budget(ctx, ns)
        _count_purpose(ctx, ns, purpose, "calls", 1)
        answer = _call(ctx, ns, chat, prompt, schema)
        _count_purpose(ctx, ns, purpose, "tokens", answer.tokens)
        result = _validate(answer.content, schema, shown)
    except LLMFailure as exc:
        log.warning("llm call failed ns=%s schema=%s reason=%s", ns, schema.__name__, exc)
        metrics.count_llm_failure(exc.reason)
        ctx.redis.hincrby(ctx.keys.stats(ns), "llm_failures", 1)
        ctx.redis.hincrby(ctx.keys.stats(ns), f"llm_fail_{exc.reason}", 1)
        return None
    metrics.count_llm(purpose, answer.tokens)
    log.debug(
        "llm call ns=%s schema=%s tokens=%d in %.1fms",
        ns,
        schema.__name__,
        answer.tokens,
        (time.perf_counter() - started) * 1000,
    )
    return result


def _spend_budget(ctx: WorkerContext, ns: str) -> None:
    """Count one call against the namespace's hourly budget; raise when it is spent."""
    cap = ctx.settings.llm_budget_per_hour
    key = ctx.keys.llm_budget(ns, int(time.time() // 3600))
    pipe = ctx.redis.pipeline(transaction=True)
    pipe.incr(key)
    pipe.expire(key, BUDGET_TTL_S)
    used = int(pipe.execute()[0])
    if used > cap:
        raise LLMFailure("budget", f"{cap} calls per hour spent")


def _call(ctx: WorkerContext, ns: str, chat: ChatClient, prompt: str, schema: type[M]) -> Answer:
    system = SYSTEM_PROMPT % json.dumps(schema.model_json_schema(), separators=(",", ":"))
    ctx.redis.hincrby(ctx.keys.stats(ns), "llm_calls", 1)
    answer = chat.complete(system, prompt)
    used = {
        "llm_tokens": answer.tokens,
        "llm_prompt_tokens": answer.prompt_tokens,
        "llm_completion_tokens": answer.completion_tokens,
    }
    if any(used.values()):
        pipe = ctx.redis.pipeline(transaction=False)
        for name, count in used.items():
            if count:
                pipe.hincrby(ctx.keys.stats(ns), name, count)
        pipe.execute()
    return answer


def _validate(content: str, schema: type[M], shown: Collection[int]) -> M:
    try:
        data = json.loads(content)
    except ValueError as exc:
        raise LLMFailure("malformed", f"content is not JSON: {content[:80]!r}") from exc
    try:
        return schema.model_validate(data, context={"shown": frozenset(shown)})
    except ValidationError as exc:
        reason = "unknown_id" if any(UNKNOWN_ID in e["msg"] for e in exc.errors()) else "schema"
        raise LLMFailure(reason, str(exc.errors()[:3])) from exc


def _count_purpose(ctx: WorkerContext, ns: str, purpose: str | None, what: str, n: int) -> None:
    """Add ``n`` to the namespace's ``<purpose>_<what>`` counter (nothing without a purpose)."""
    if purpose and n:
        ctx.redis.hincrby(ctx.keys.stats(ns), f"{purpose}_{what}", n)
