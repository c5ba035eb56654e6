"""worker.search.candidates: the reads a search makes, against the real Redis."""

from __future__ import annotations

import pytest

from producer.protocol import link_label
from worker.bulk import BulkTransaction
from worker.index.rows import Pinned
from worker.search.candidates import Cand, load_links
from worker.store import notes
from worker.store.notes import Link


@pytest.mark.parametrize("degree", [5, 300])
def test_links_come_back_whole_with_their_weights_and_labels(ctx, degree):
    """One HGETALL per note gives its links' weights and the packed links the hit labels come
    from, whatever the degree (a hash past 128 fields is no longer a listpack)."""
    links = {f"n{i:03d}": round(0.1 + i / 1000, 4) for i in range(degree)}
    pipe = BulkTransaction(ctx.redis)
    written = [
        Link("a", nb, w, "r", "supports" if i % 2 else "related")
        for i, (nb, w) in enumerate(links.items())
    ]
    notes.write_links(pipe, ctx.keys, "ns", written, source="rule:similarity")
    pipe.execute()
    cand = Cand("a", "ns", 0, {})
    load_links(ctx, {"ns": Pinned(None)}, [cand])
    assert cand.links == links
    assert cand.linked is not None
    labels = {nb.decode(): link_label(raw) for nb, raw in cand.linked.packed.items()}
    assert labels == cand.linked.labels == {link.b: link.label for link in written}
