"""AsyncMemoryClient: the same methods as MemoryClient, awaitable, against the real worker code."""

from __future__ import annotations

import asyncio

import pytest

from producer import AsyncMemoryClient, NotFound, ReplyTimeout


def test_async_client_round_trip(settings, server):
    async def scenario() -> None:
        async with AsyncMemoryClient(settings) as mem:
            first = await mem.store("async agents write without waiting", namespace="aio")
            ids = await mem.store_many(
                ["async writes are one round trip", "agents never wait"], namespace="aio"
            )
            await mem.flush("aio")
            hits = await mem.search("agents waiting", namespace="aio", k=3)
            assert {h.id for h in hits} <= {first, *ids} and hits
            note = await mem.get(first, namespace="aio")
            assert note.content.startswith("async agents")
            assert isinstance(await mem.connected(first, namespace="aio"), list)
            assert "<memory" in await mem.context("async writes", namespace="aio")
            await mem.delete(first, namespace="aio")
            await mem.flush("aio")
            with pytest.raises(NotFound):
                await mem.get(first, namespace="aio")
            assert (await mem.stats("aio")).notes == 2

    asyncio.run(scenario())


def test_async_search_times_out_without_worker(settings):
    async def scenario() -> None:
        async with AsyncMemoryClient(settings) as mem:
            await mem.store("queued while no worker runs", namespace="aio-idle")
            with pytest.raises(ReplyTimeout):
                await mem.search("queued", namespace="aio-idle", timeout_s=0.2)

    asyncio.run(scenario())
