"""``zettelq demo``: an agent stores a few memories, searches them and walks their links."""

from __future__ import annotations

import sys

from producer import MemoryClient
from worker.settings import WorkerSettings

#: What a research agent learnt about a customer's Snowflake set-up (the example of the
#: zettelkasten-memory article zettelq's idea comes from).
MEMORIES = [
    "The customer's Snowflake account uses key-pair auth with Azure AD",
    "Snowflake uses AES-256 encryption at rest with hierarchical key model",
    "Customer requires Tri-Secret Secure with AWS KMS for key sovereignty",
    "Network policies restrict access to PrivateLink endpoints only",
    "Customer prefers Snowflake on AWS with PrivateLink",
    "Key rotation for the Snowflake key-pair happens every 90 days",
    "The research agent found that Azure AD is the customer's identity provider",
]
#: Each query with the memory a reader expects first (tests/integration/test_demo.py holds it).
QUERIES = {
    "encryption and key management": MEMORIES[1],
    "authentication setup": MEMORIES[0],
    "who is the identity provider": MEMORIES[6],
}
NAMESPACE = "demo"
K = 3  #: hits shown per query
MIN_RELEVANCE = 0.25  #: hits below this relevance are not shown (search's min_relevance)


def run_demo(settings: WorkerSettings) -> int:
    out = sys.stdout.write
    with MemoryClient(settings) as mem:
        ids = mem.store_many(
            [
                {
                    # fixed ids: a second run updates these notes instead of adding copies
                    "id": f"demo-{i}",
                    "content": m,
                    "agent": "researcher",
                    "metadata": {"source": "zettelq demo"},
                }
                for i, m in enumerate(MEMORIES)
            ],
            namespace=NAMESPACE,
        )
        out(f"stored {len(ids)} memories in namespace {NAMESPACE!r} (fire-and-forget)\n")
        mem.flush(NAMESPACE, timeout_s=60)
        for query in QUERIES:
            out(f"\nsearch: {query!r}\n")
            hits = mem.search(query, namespace=NAMESPACE, k=K, min_relevance=MIN_RELEVANCE)
            for h in hits:
                out(f"  [{h.score:.3f}] {h.content}\n")
                out(f"      tags={h.tags} hop={h.hop} links={len(h.links)}\n")
        out(f"\nconnected({ids[0][:8]}..., max_hops=2): {MEMORIES[0]!r}\n")
        for n in mem.connected(ids[0], namespace=NAMESPACE, max_hops=2):
            out(f"  hop {n.hop} (weight {n.weight:.2f}): {n.content}\n")
        stats = mem.stats(NAMESPACE)
        out(f"\nstats: notes={stats.notes} links={stats.links} pending={stats.pending}\n")
    return 0
