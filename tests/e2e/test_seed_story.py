"""The self-organising Zettelkasten tutorial's story end to end with a real `zettelq worker`
process: five events in, the periodic jobs run (consolidation writes an insight over the change
from React to Svelte, saying what holds now), and "what is the current frontend technology and
why?" answers with the Svelte note first among the notes and the React note marked superseded;
as of a time before the switch the React note is the valid one."""

from __future__ import annotations

import time

import pytest

from producer import MemoryClient
from tests.e2e.workers import running, wait_until
from worker.context import WorkerContext
from worker.organise.consolidation import consolidate_namespace
from worker.organise.merge import merge_namespace
from worker.organise.supersession import supersede_namespace
from worker.store.integrity import check_namespace

pytestmark = pytest.mark.e2e

EVENTS = [
    "The project 'Apollo' aims to build a dashboard for tracking solar panel efficiency.",
    "We chose React for the frontend because the team knows it well.",
    "The backend must be Python to support the data science libraries.",
    "Client called. They are unhappy with React performance on low-end devices.",
    "We are switching the frontend to Svelte for better performance.",
]
QUERY = "what is the current frontend technology and why?"


def test_seed_001_the_switch_to_svelte_supersedes_react(settings):
    ns = "apollo"
    with running(settings), MemoryClient(settings) as mem:
        ids = [mem.store(event, namespace=ns, agent="pm") for event in EVENTS[:4]]
        mem.flush(ns, timeout_s=60)
        before_switch = time.time()
        ids.append(mem.store(EVENTS[4], namespace=ns, agent="pm"))
        wait_until(lambda: mem.stats(ns).notes == 5 and mem.stats(ns).pending == 0, 60)
        react, svelte = ids[1], ids[4]

        ctx = WorkerContext.build(settings)
        try:
            consolidate_namespace(ctx, ns)
            supersede_namespace(ctx, ns)
            merge_namespace(ctx, ns)
            assert check_namespace(ctx, ns) == []
        finally:
            ctx.close()

        hits = mem.search(QUERY, namespace=ns, k=6, timeout_s=60)  # the five and the insight
        notes = [h for h in hits if h.kind == "note"]
        assert notes[0].id == svelte and notes[0].valid_to is None
        (insight,) = [h for h in hits if h.kind == "insight"]  # over the change, as true now
        assert {react, ids[3], svelte} <= set(mem.get(insight.id, namespace=ns).links)
        assert EVENTS[4] in insight.content and EVENTS[1] not in insight.content
        marked = {h.id: h for h in hits}[react]
        assert marked.superseded_by == svelte
        assert marked.valid_to == mem.get(svelte, namespace=ns).created_at
        assert all(h.valid_to is None for h in hits if h.id != react)

        past = mem.search(QUERY, namespace=ns, k=5, as_of=before_switch, timeout_s=60)
        assert past[0].id == react and svelte not in {h.id for h in past}
        assert mem.get(react, namespace=ns).superseded_by == svelte
