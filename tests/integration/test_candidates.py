"""worker.candidates: the reads a search makes, against the real Redis."""

from __future__ import annotations

import pytest

from worker import notes
from worker.candidates import Cand, load_links


@pytest.mark.parametrize("degree", [5, 300])
def test_links_come_back_whole_with_their_weights(ctx, monkeypatch, degree):
    """A small link set comes back in ZRANGE's order; one too large for a single ZSCAN reply
    (here: over LINKS_SCAN) is read again with ZRANGE."""
    monkeypatch.setattr(notes, "LINKS_SCAN", 50)
    links = {f"n{i:03d}": round(0.1 + i / 1000, 4) for i in range(degree)}
    ctx.redis.zadd(ctx.keys.links("ns", "a"), links)
    reread = []
    zrange = ctx.redis.zrange
    monkeypatch.setattr(ctx.redis, "zrange", lambda *a, **k: reread.append(a) or zrange(*a, **k))
    cand = Cand("a", "ns", 0, {})
    load_links(ctx, [cand])
    assert cand.links == links
    assert len(reread) == (degree > 50)
    if degree < 128:
        assert list(cand.links) == sorted(links, key=lambda nb: (links[nb], nb))
