"""From the inbox to committed notes: the dispatcher that queues drains (``dispatch``), the drain
of a shard stream under its lease (``drain``, with ``signing`` and the dead-letter stream in
``deadletter``), the ingest of a batch (``ingest``: construction, candidates, links, commit;
deletes in ``deletes``, restores of an export in ``restore``) and read-your-writes
(``freshness``: a search or flush waits until its namespaces' inbox is committed)."""

from worker.intake.dispatch import Dispatcher
from worker.intake.drain import drain_shard, run_drain
from worker.intake.freshness import wait_fresh
from worker.intake.ingest import handle_jobs
from worker.intake.signing import check_signature

__all__ = [
    "Dispatcher",
    "check_signature",
    "drain_shard",
    "handle_jobs",
    "run_drain",
    "wait_fresh",
]
