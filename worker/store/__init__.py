"""The canonical data in Redis and every write to it: notes and their links (``notes``), the
change log's writers, leases that fence a namespace's writers (``lease``), the degree cap
(``degree``), tombstones (``tombstone``), reads of the whole link graph (``graph``),
consistency checks (``integrity``) and the one-off link layout migration (``migrate``).
Functions here take the context or a Redis client first; none decides policy (which links,
which notes to evict): organise/ and intake/ do, and call these."""

from worker.store.graph import Graph, read_graph
from worker.store.integrity import check_namespace
from worker.store.lease import Lease
from worker.store.notes import Fields, Link, read_notes
from worker.store.tombstone import tombstone_notes

__all__ = [
    "Fields",
    "Graph",
    "Lease",
    "Link",
    "check_namespace",
    "read_graph",
    "read_notes",
    "tombstone_notes",
]
