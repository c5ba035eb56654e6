"""Query-side options through the real worker code: as_of, diversity, weights, bad options."""

from __future__ import annotations

import time

import pytest

from producer import InvalidInput


def test_as_of_hides_notes_recorded_later(client, server):
    old = client.store("the build server runs Jenkins", namespace="asof")
    client.flush("asof")
    cut = time.time()
    time.sleep(0.01)
    new = client.store("the build server runs GitHub Actions now", namespace="asof")
    now_ids = {h.id for h in client.search("build server", namespace="asof")}
    then_ids = {h.id for h in client.search("build server", namespace="asof", as_of=cut)}
    assert now_ids == {old, new}
    assert then_ids == {old}


def test_diversity_keeps_near_duplicates_out_of_the_top(client, server):
    dupes = [f"the deploy key for staging is rotated weekly {'!' * i}" for i in range(4)]
    other = "deploy approvals need two reviewers on staging"
    ids = client.store_many([*dupes, other], namespace="mmr")
    plain = client.search("staging deploy", namespace="mmr", k=2)
    diverse = client.search("staging deploy", namespace="mmr", k=2, diversity=0.7)
    assert ids[-1] not in {h.id for h in plain}
    assert ids[-1] in {h.id for h in diverse}


def test_weights_switch_channels_per_search(client, server):
    nid = client.store("zebra crossings near the office", namespace="w")
    client.flush("w")
    assert [h.id for h in client.search("zebra", namespace="w", weights={"lexical": 1})] == [nid]
    assert client.search("zebra", namespace="w", weights={"lexical": 0, "dense": 0}) == []


@pytest.mark.parametrize(
    "options",
    [
        {"kk": 3},
        {"weights": {"bogus": 1}},
        {"weights": {"dense": -1}},
        {"diversity": 2},
        {"min_relevance": -0.1},
        {"min_relevance": "high"},
        {"as_of": "not a date"},
    ],
)
def test_bad_search_options_raise_invalid_input(client, options):
    with pytest.raises(InvalidInput):
        client.search("anything", namespace="bad", **options)
