"""``zettelq demo``: an agent stores example memories, searches them and walks their links."""

from __future__ import annotations

import sys

from producer import MemoryClient
from worker.settings import WorkerSettings

#: The example memories of the zettelkasten-memory article (an agent researching a customer's
#: Snowflake setup).
MEMORIES = [
    "The customer's Snowflake account uses key-pair auth with Azure AD",
    "Snowflake uses AES-256 encryption at rest with hierarchical key model",
    "Customer requires Tri-Secret Secure with AWS KMS for key sovereignty",
    "Network policies restrict access to PrivateLink endpoints only",
    "Customer prefers Snowflake on AWS with PrivateLink",
    "Key rotation for the Snowflake key-pair happens every 90 days",
    "The research agent found that Azure AD is the customer's identity provider",
]
QUERIES = ["encryption and key management", "authentication setup"]
NAMESPACE = "demo"


def run_demo(settings: WorkerSettings) -> int:
    out = sys.stdout.write
    with MemoryClient(settings) as mem:
        ids = mem.store_many(
            [
                {
                    # fixed ids: a second run updates these notes instead of adding copies
                    "id": f"seed-000-{i}",
                    "content": m,
                    "agent": "researcher",
                    "metadata": {"source": "seed-000"},
                }
                for i, m in enumerate(MEMORIES)
            ],
            namespace=NAMESPACE,
        )
        out(f"stored {len(ids)} memories in namespace {NAMESPACE!r} (fire-and-forget)\n")
        mem.flush(NAMESPACE, timeout_s=60)
        for query in QUERIES:
            out(f"\nsearch: {query!r}\n")
            for h in mem.search(query, namespace=NAMESPACE, k=3):
                out(f"  [{h.score:.3f}] {h.content}\n")
                out(f"      tags={h.tags} hop={h.hop} links={len(h.links)}\n")
        out(f"\nconnected({ids[0][:8]}..., max_hops=2): {MEMORIES[0]!r}\n")
        for n in mem.connected(ids[0], namespace=NAMESPACE, max_hops=2):
            out(f"  hop {n.hop} (weight {n.weight:.2f}): {n.content}\n")
        stats = mem.stats(NAMESPACE)
        out(f"\nstats: notes={stats.notes} links={stats.links} pending={stats.pending}\n")
    return 0
