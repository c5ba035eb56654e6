from __future__ import annotations

from collections.abc import Iterable, Mapping
from itertools import pairwise

from hypothesis import given, settings
from hypothesis import strategies as st

from worker.organise.consolidation import (
    INSIGHT_MAX_CHARS,
    Plan,
    centrality_order,
    find_clusters,
    insight_id,
    plan_insights,
    summarise,
)


def undirected(*edges: tuple[str, str, float]) -> dict[str, dict[str, float]]:
    links: dict[str, dict[str, float]] = {}
    for a, b, w in edges:
        links.setdefault(a, {})[b] = w
        links.setdefault(b, {})[a] = w
    return links


def test_clusters_are_groups_held_by_strong_links_of_at_least_three_notes() -> None:
    links = undirected(
        ("a", "b", 0.8),
        ("b", "c", 0.6),
        ("c", "a", 0.5),  # a cluster
        ("c", "x", 0.1),  # too weak to join x
        ("x", "y", 0.9),  # a pair: too small
    ) | {"lonely": {}}

    assert find_clusters(links, min_weight=0.3, max_size=10) == [("a", "b", "c")]


def test_a_group_over_the_size_cap_splits_along_its_weakest_links() -> None:
    links = undirected(
        ("a", "b", 0.9),
        ("b", "c", 0.9),
        ("c", "a", 0.9),
        ("c", "d", 0.4),  # the bridge
        ("d", "e", 0.8),
        ("e", "f", 0.8),
        ("f", "d", 0.8),
    )

    assert find_clusters(links, 0.3, max_size=6) == [("a", "b", "c", "d", "e", "f")]
    assert find_clusters(links, 0.3, max_size=5) == [("a", "b", "c"), ("d", "e", "f")]


def test_a_chain_with_thousands_of_distinct_weights_splits_without_recursing() -> None:
    # Every link weaker than the next: each split peels one note off the end, thousands deep.
    ids = [f"n{i:05d}" for i in range(5_000)]
    links = undirected(*((a, b, 0.3 + i * 1e-5) for i, (a, b) in enumerate(pairwise(ids))))

    clusters = find_clusters(links, 0.3, max_size=12)

    assert clusters == [tuple(ids[-12:])]


def reference_split(
    links: Mapping[str, Mapping[str, float]], min_weight: float, max_size: int
) -> list[tuple[str, ...]]:
    """The recursive split as first written (drop a part's weakest links, split again), which
    find_clusters must match."""
    strong = {
        a: {b: w for b, w in nbs.items() if w >= min_weight and b in links and b != a}
        for a, nbs in links.items()
    }

    def components(adj: Mapping[str, Mapping[str, float]], nodes: Iterable[str]) -> list[set[str]]:
        seen: set[str] = set()
        out: list[set[str]] = []
        for start in sorted(nodes):
            if start not in seen:
                comp, frontier = {start}, [start]
                while frontier:
                    frontier = [nb for n in frontier for nb in adj.get(n, {}) if nb not in comp]
                    comp.update(frontier)
                seen |= comp
                out.append(comp)
        return out

    def split(comp: set[str], adj: Mapping[str, Mapping[str, float]]) -> list[set[str]]:
        if len(comp) <= max_size:
            return [comp]
        weakest = min(w for a in comp for b, w in adj[a].items() if b in comp)
        inner = {a: {b: w for b, w in adj[a].items() if b in comp and w > weakest} for a in comp}
        return [p for sub in components(inner, comp) for p in split(sub, inner)]

    parts = [p for comp in components(strong, strong) for p in split(comp, strong)]
    return sorted(tuple(sorted(p)) for p in parts if len(p) >= 3)


EDGES = st.lists(
    st.tuples(
        st.integers(0, 14), st.integers(0, 14), st.sampled_from([0.2, 0.3, 0.4, 0.5, 0.7, 0.9])
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(edges=EDGES, max_size=st.integers(3, 8))
def test_clusters_match_the_recursive_split_on_small_graphs(edges, max_size) -> None:
    links = undirected(*((f"n{a:02d}", f"n{b:02d}", w) for a, b, w in edges if a != b))

    assert find_clusters(links, 0.3, max_size) == reference_split(links, 0.3, max_size)


def test_links_to_notes_outside_the_map_are_ignored() -> None:
    links = {"a": {"b": 0.9, "ghost": 0.9}, "b": {"a": 0.9, "c": 0.9}, "c": {"b": 0.9}}

    assert find_clusters(links, 0.3, 10) == [("a", "b", "c")]


def test_insight_ids_depend_only_on_the_member_set() -> None:
    assert insight_id(["b", "a", "c"]) == insight_id(["c", "b", "a"])
    assert insight_id(["a", "b", "c"]) != insight_id(["a", "b", "d"])


def test_plans_create_new_clusters_update_grown_ones_and_skip_the_rest() -> None:
    known = {"i-old": ("a", "b", "c"), "i-gone": ("x", "y", "z")}
    clusters = [
        ("a", "b", "c"),  # unchanged
        ("a", "b", "c", "d"),  # grown
        ("x", "y", "z", "w"),  # grown, but its insight was deleted
        ("p", "q", "r"),  # new
        ("x", "y"),  # shrunk (inside a known cluster)
    ]

    plans = plan_insights(clusters, known, retired={"i-gone"})

    assert plans == [
        Plan("i-old", ("a", "b", "c", "d"), ("a", "b", "c")),
        Plan(insight_id(("p", "q", "r")), ("p", "q", "r"), None),
    ]


def test_an_unchanged_cluster_plans_nothing_once_its_insight_is_known() -> None:
    cluster = ("a", "b", "c")
    (plan,) = plan_insights([cluster], {}, set())

    assert plan_insights([cluster], {plan.insight_id: cluster}, set()) == []


def test_members_are_ordered_by_link_weight_inside_the_cluster() -> None:
    links = undirected(("a", "b", 0.3), ("b", "c", 0.9), ("c", "a", 0.2), ("a", "out", 5.0))

    assert centrality_order(["a", "b", "c"], links) == ["b", "c", "a"]


def test_the_summary_takes_first_sentences_in_order_within_the_cap() -> None:
    contents = [
        "We chose React. The team knows it.",
        "Client unhappy with React performance! On low-end devices.",
        "We chose React. Repeated.",
        "x" * 50,
    ]

    assert summarise(contents, max_chars=80) == (
        "We chose React. Client unhappy with React performance!"
    )
    long = summarise(["y" * 1000])
    assert len(long) == INSIGHT_MAX_CHARS and long.endswith("\u2026")
