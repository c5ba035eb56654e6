"""worker.search.candidates.rank_top: scoring stops where no candidate left can make the cut,
and the best ``width`` come out exactly as when every candidate is scored."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from producer.protocol import pack_link
from worker.search.candidates import Cand, LinkRow, order, rank_top, score

NOW = 1_800_000_000.0
HALF_LIFE_S = 30 * 86_400.0

row = st.fixed_dictionaries(
    {
        "relevance": st.floats(0, 2),
        "importance": st.floats(0, 1),
        "age_days": st.floats(0, 400),
        "superseded": st.booleans(),
        "links": st.dictionaries(st.sampled_from("abcdef"), st.floats(0, 1), max_size=4),
    }
)


def cands(rows: list[dict]) -> list[Cand]:
    out = []
    for i, r in enumerate(rows):
        fields = {
            "importance": str(r["importance"]),
            "created_at": str(NOW - r["age_days"] * 86_400),
            "last_access": "0",
        }
        if r["superseded"]:
            fields["valid_to"] = str(NOW - 1)
        linked = LinkRow({nb.encode(): pack_link(w, {}) for nb, w in r["links"].items()})
        cand = Cand(f"n{i:03d}", "ns", 0, fields, relevance=r["relevance"])
        cand.linked, cand.links = linked, linked.weights
        out.append(cand)
    return out


@given(st.lists(row, max_size=60), st.integers(1, 30), st.sampled_from([0.0, 0.1]))
def test_the_best_width_are_those_of_scoring_every_candidate(rows, width, boost_scale):
    def scored(c: Cand) -> None:
        score(c, NOW, HALF_LIFE_S, boost_scale)

    everyone = cands(rows)
    for c in everyone:
        scored(c)
    expected = sorted(everyone, key=order(NOW))[:width]
    got = rank_top(cands(rows), width, scored, NOW, boost_scale)
    assert [(c.id, c.score) for c in got[:width]] == [(c.id, c.score) for c in expected]


def test_scoring_stops_once_the_rest_cannot_make_the_cut():
    rows = [
        {"relevance": r, "importance": 0.5, "age_days": 0, "superseded": False, "links": {}}
        for r in (1.0, 0.9, 0.8, 0.3, 0.2, 0.1)
    ]
    seen: list[str] = []

    def scored(c: Cand) -> None:
        seen.append(c.id)
        score(c, NOW, HALF_LIFE_S, 0.0)

    got = rank_top(cands(rows), 2, scored, NOW, 0.0)
    assert [c.id for c in got[:2]] == ["n000", "n001"]
    assert seen == ["n000", "n001", "n002"]  # 0.3 x 1.5 < 0.9 x 1.0 x 1.0: not scored
