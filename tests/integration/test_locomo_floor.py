"""Regression guard for retrieval quality: one LoCoMo conversation through the real worker code.

The floor sits a few points under the value measured with the default (offline) settings on
conversation 30 (see bench/README.md); it guards against regressions, it is not a target.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.locomo import load_conversation

DATA = Path(__file__).resolve().parents[3] / "shared" / "data" / "locomo-dev" / "30.json"
RECALL_AT_10_FLOOR = 0.48  #: measured 0.530 on 2026-11-30 with the defaults


@pytest.mark.skipif(not DATA.exists(), reason=f"LoCoMo sample not found at {DATA}")
def test_default_recall_at_10_on_one_conversation_stays_above_the_floor(client, server):
    notes, questions = load_conversation(DATA)
    for start in range(0, len(notes), 500):
        client.store_many(notes[start : start + 500], namespace="locomo-30")
    client.flush("locomo-30", timeout_s=120)
    recalls = []
    for q in questions:
        hits = client.search(q["q"], namespace="locomo-30", k=10)
        recalls.append(len(q["evidence"] & {h.id for h in hits}) / len(q["evidence"]))
    recall = sum(recalls) / len(recalls)
    assert recall >= RECALL_AT_10_FLOOR, f"recall@10 {recall:.3f} under {RECALL_AT_10_FLOOR}"
