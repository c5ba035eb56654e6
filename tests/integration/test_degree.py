"""plan_cap against the real Redis: which existing links the cap drops, and the metadata it
reads for them (only the weakest links' metadata is read)."""

from __future__ import annotations

from worker.context import WorkerContext
from worker.store import notes
from worker.store.degree import plan_cap
from worker.store.notes import Link

NS = "deg"


def hub(ctx: WorkerContext, weights: dict[str, float]) -> None:
    """A note "hub" linked to each key of ``weights``, the reason naming the neighbour."""
    pipe = ctx.redis.pipeline(transaction=True)
    links = [Link("hub", nb, w, f"reason {nb}", f"label {nb}") for nb, w in weights.items()]
    notes.write_links(pipe, ctx.keys, NS, links, source="test")
    pipe.execute()


def test_the_cap_drops_the_weakest_existing_links_with_their_metadata(
    ctx: WorkerContext,
) -> None:
    ctx.settings.max_degree = 4
    hub(ctx, {"a": 0.9, "b": 0.2, "c": 0.3, "d": 0.8})
    new = [Link("hub", "x", 0.7, "new"), Link("hub", "y", 0.6, "new")]

    capped = plan_cap(ctx, NS, new)

    assert capped.links == new
    assert sorted(capped.dropped) == [("b", "hub", 0.2), ("c", "hub", 0.3)]
    by_pair = dict(zip([(a, b) for a, b, _ in capped.dropped], capped.metas, strict=True))
    assert by_pair[("b", "hub")]["reason"] == "reason b"
    assert by_pair[("c", "hub")]["label"] == "label c"


def test_links_the_commit_removes_do_not_count_and_are_never_dropped(ctx: WorkerContext) -> None:
    ctx.settings.max_degree = 3
    hub(ctx, {"a": 0.1, "b": 0.2, "c": 0.9})
    new = [Link("hub", "x", 0.5, "new"), Link("hub", "y", 0.6, "new")]

    capped = plan_cap(ctx, NS, new, removed=[("hub", "a")])

    assert capped.links == new
    assert capped.dropped == [("b", "hub", 0.2)]
    assert capped.metas[0]["reason"] == "reason b"


def test_a_new_link_weaker_than_a_full_hubs_links_is_refused(ctx: WorkerContext) -> None:
    ctx.settings.max_degree = 2
    hub(ctx, {"a": 0.8, "b": 0.9})

    capped = plan_cap(ctx, NS, [Link("n", "hub", 0.1, "new")])

    assert capped.links == [] and capped.dropped == [] and capped.refused == 1
