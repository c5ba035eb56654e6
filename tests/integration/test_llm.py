"""ask_json against a scripted loopback chat server: good answers, malformed JSON, answers off
the schema or naming unknown ids, slow answers, HTTP errors, a spent budget — all fail closed."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import BaseModel

from tests.conftest import make_settings
from tests.integration.chat_server import ChatServer, Scripted, answer, chat
from worker.context import WorkerContext
from worker.organise import llm

__all__ = ["chat"]


class Pick(BaseModel):
    picks: list[llm.ShownRef]
    label: str


def build(tmp_path: Path, chat_url: str | None, **overrides: object) -> WorkerContext:
    values: dict[str, object] = {"llm_url": chat_url, "llm_timeout_s": 2.0, "llm_api_key": "sk-t"}
    values.update(overrides)
    return WorkerContext.build(make_settings(tmp_path, **values))


@pytest.fixture
def llm_ctx(redis_db, tmp_path, chat: ChatServer) -> Iterator[WorkerContext]:
    ctx = build(tmp_path, chat.url)
    yield ctx
    ctx.close()


def stats(ctx: WorkerContext, ns: str = "ns") -> dict[str, int]:
    raw = ctx.redis.hgetall(ctx.keys.stats(ns))
    return {k.decode(): int(v) for k, v in raw.items() if k.startswith(b"llm_")}


def test_a_good_answer_is_validated_and_its_ids_mapped_back(llm_ctx, chat):
    chat.reply_with(answer({"picks": [2], "label": "supports"}))
    shown = llm.number_items(["note-a", "note-b"])

    got = llm.ask_json(llm_ctx, "ns", "[1] a\n[2] b", Pick, shown=shown)

    assert got is not None and got.label == "supports"
    assert [shown[n] for n in got.picks] == ["note-b"]
    (request,) = chat.requests
    assert request["path"] == "/v1/chat/completions"
    assert request["model"] == llm_ctx.settings.llm_model
    assert request["response_format"] == {"type": "json_object"}
    assert request["messages"][1] == {"role": "user", "content": "[1] a\n[2] b"}
    assert '"picks"' in request["messages"][0]["content"]  # the schema is in the prompt
    assert stats(llm_ctx) == {"llm_calls": 1, "llm_tokens": 42}


@pytest.mark.parametrize(
    ("reply", "reason"),
    [
        (Scripted("this is not json"), "malformed"),
        (answer({"picks": [1]}), "schema"),
        (answer({"picks": [3], "label": "x"}), "unknown_id"),
        (answer({"picks": [0], "label": "x"}), "unknown_id"),
        (Scripted(status=500), "http"),
        (Scripted(status=401), "http"),
    ],
)
def test_a_bad_answer_fails_closed_and_is_counted(llm_ctx, chat, reply, reason):
    chat.reply_with(reply)

    got = llm.ask_json(llm_ctx, "ns", "[1] a\n[2] b", Pick, shown=llm.number_items(["a", "b"]))

    assert got is None
    counters = stats(llm_ctx)
    assert counters["llm_failures"] == 1
    assert counters[f"llm_fail_{reason}"] == 1
    assert counters["llm_calls"] == 1


def test_a_slow_answer_times_out(redis_db, tmp_path, chat):
    ctx = build(tmp_path, chat.url, llm_timeout_s=0.3)
    chat.reply_with(answer({"picks": [1], "label": "late"}, delay_s=5.0))
    try:
        assert llm.ask_json(ctx, "ns", "p", Pick, shown={1}) is None
        assert stats(ctx)["llm_fail_timeout"] == 1
    finally:
        ctx.close()


def test_an_unreachable_endpoint_fails_closed(redis_db, tmp_path):
    ctx = build(tmp_path, "http://127.0.0.1:9/v1")
    try:
        assert llm.ask_json(ctx, "ns", "p", Pick) is None
        assert stats(ctx)["llm_fail_unreachable"] == 1
    finally:
        ctx.close()


def test_the_hourly_budget_is_per_namespace(redis_db, tmp_path, chat):
    ctx = build(tmp_path, chat.url, llm_budget_per_hour=2)
    chat.reply_with(answer({"picks": [1], "label": "ok"}))
    try:
        results = [llm.ask_json(ctx, "ns", "p", Pick, shown={1}) for _ in range(3)]
        other = llm.ask_json(ctx, "other", "p", Pick, shown={1})

        assert [r is not None for r in results] == [True, True, False]
        assert other is not None
        assert len(chat.requests) == 3  # the call over budget never left the worker
        assert stats(ctx)["llm_fail_budget"] == 1
        (key,) = ctx.redis.keys(ctx.keys.llm_budget("ns", 0).rsplit(":", 1)[0] + ":*")
        assert 3_600 < ctx.redis.ttl(key) <= 7_200
    finally:
        ctx.close()


def test_with_the_llm_off_nothing_is_called_or_counted(ctx, chat):
    assert ctx.settings.llm_url is None
    assert llm.ask_json(ctx, "ns", "p", Pick) is None
    assert chat.requests == [] and stats(ctx) == {}


def test_the_api_key_is_sent_as_a_bearer_token(llm_ctx, chat):
    chat.reply_with(answer({"picks": [1], "label": "ok"}))

    assert llm.ask_json(llm_ctx, "ns", "p", Pick, shown={1}) is not None
    assert chat.requests[0]["authorization"] == "Bearer sk-t"
