"""embed(): the worker's vectors in one round trip; search(reinforce=False) counts no access."""

from __future__ import annotations

import asyncio
import time

import pytest

from producer import AsyncMemoryClient, InvalidInput
from producer.protocol import SearchJob
from worker.search import retrieve as search


def test_embed_returns_the_vectors_the_worker_gives_notes(client, ctx, server):
    texts = ["Snowflake key-pair auth", "the launch is on Tuesday"]
    vectors = client.embed(texts, namespace="acme")
    assert vectors == [pytest.approx(row.tolist(), abs=1e-7) for row in ctx.embedder.embed(texts)]

    async def twin():
        async with AsyncMemoryClient(client.settings) as aclient:
            return await aclient.embed(texts)

    assert asyncio.run(twin()) == vectors


def test_embed_refuses_bad_texts_before_sending(client):
    for bad in ([], "a str", ["ok", ""], ["x" * (client.settings.max_content_bytes + 1)]):
        with pytest.raises(InvalidInput):
            client.embed(bad)


def test_a_search_without_reinforcement_leaves_access_counts(client, server):
    nid = client.store("The deploy pipeline runs on GitHub Actions", namespace="ci")
    assert [h.id for h in client.search("deploy pipeline", namespace="ci", reinforce=False)] == [
        nid
    ]
    assert client.get(nid, namespace="ci").access_count == 0
    client.search("deploy pipeline", namespace="ci")
    assert client.get(nid, namespace="ci").access_count == 1


def test_the_worker_refuses_an_embed_job_past_the_limits(ctx):
    too_many = ["x"] * (ctx.settings.max_batch + 1)
    too_long = ["x" * (ctx.settings.max_content_bytes + 1)]
    for texts in (too_many, too_long):
        job = SearchJob(
            job_id="j1", kind="embed", namespaces=["acme"], texts=texts, deadline=time.time() + 5
        )
        reply = search.handle(ctx, job)
        assert reply is not None and not reply.ok and reply.vectors == []
