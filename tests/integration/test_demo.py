"""The demo's answers are right: each query it prints returns the note a reader expects first,
and no hit below its relevance floor."""

from __future__ import annotations

import re

from worker.cli.demo import MEMORIES, MIN_RELEVANCE, QUERIES, run_demo


def test_each_demo_query_returns_the_expected_note_first(settings, server, capsys):
    assert run_demo(settings) == 0
    out = capsys.readouterr().out
    for query, expected in QUERIES.items():
        block = out.split(f"search: {query!r}\n", 1)[1].split("\n\n", 1)[0]
        shown = re.findall(r"^  \[[\d.]+\] (.*)$", block, re.M)
        assert shown, f"{query!r} printed no hit"
        assert shown[0] == expected, f"{query!r} put {shown[0]!r} first"
        assert set(shown) <= set(MEMORIES)


def test_min_relevance_keeps_only_hits_that_reach_it(client, server):
    client.store_many(MEMORIES, namespace="floor")
    client.flush("floor")
    every = client.search("network access", namespace="floor", k=len(MEMORIES))
    floored = client.search(
        "network access", namespace="floor", k=len(MEMORIES), min_relevance=MIN_RELEVANCE
    )
    assert len(every) == len(MEMORIES)  # without a floor: k hits while there are k notes
    assert 0 < len(floored) < len(every)
    assert all(h.relevance >= MIN_RELEVANCE for h in floored)
    assert [h.id for h in floored] == [h.id for h in every if h.relevance >= MIN_RELEVANCE]
