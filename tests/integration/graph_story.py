"""A small namespace for the graph explorer's tests: a supersession (React, then Svelte), a
cluster that consolidation abstracts into an insight, unrelated notes, and hostile text (a
script tag, a control character), organised by the real worker code."""

from __future__ import annotations

from dataclasses import dataclass

from producer import MemoryClient
from tests.conftest import drain_all
from worker.context import WorkerContext
from worker.organise.consolidation import consolidate_namespace

NS = "graph"
DAY = 86_400.0
T0 = 1_767_225_600.0  #: 2026-01-01 UTC
XSS = "<script>alert(1)</script>"
CONTROL = "A bell \x07 and an escape \x1b in a note about solar panel readings."
REACT = "We chose React for the frontend because the team knows it well."
SVELTE = "We are switching the frontend to Svelte for better performance."
STORY = [
    "The project 'Apollo' aims to build a dashboard for tracking solar panel efficiency.",
    REACT,
    "Postgres stores the solar panel readings every minute.",
    "Client called. They are unhappy with React performance on low-end devices.",
    "Solar panel readings arrive from the inverters over MQTT.",
    SVELTE,
    "The inverters push solar panel readings to Postgres through MQTT.",
    "Lunch on Friday is pizza.",
    XSS,
    CONTROL,
]


@dataclass(frozen=True)
class Story:
    ids: dict[str, str]  #: content -> note id
    insight: str  #: the insight consolidation wrote


def store_story(ctx: WorkerContext, mem: MemoryClient, ns: str = NS) -> Story:
    items = [
        {"content": text, "event_time": T0 + i * DAY, "tags": ["story"], "agent": "tester"}
        for i, text in enumerate(STORY)
    ]
    ids = dict(zip(STORY, mem.store_many(items, namespace=ns), strict=True))
    drain_all(ctx)
    assert consolidate_namespace(ctx, ns) >= 1
    clusters = ctx.redis.hkeys(ctx.keys.clusters(ns))
    return Story(ids, clusters[0].decode())
