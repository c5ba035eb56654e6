"""From the inbox to committed notes: the dispatcher that queues drains (``dispatch``), the drain
of a shard stream under its lease (``drain``, with ``signing`` and the dead-letter stream in
``deadletter``), the ingest of a batch (``ingest``: construction, candidates, links, commit;
deletes in ``deletes``, restores of an export in ``restore``) and read-your-writes
(``freshness``: a search or flush waits until its namespaces' inbox is committed).

Nothing is re-exported here: ``zettelq dead`` reads the dead-letter stream through
``intake.deadletter`` on a base install, which a package that imported the drain (numpy, FAISS)
would break. Import from the modules: ``from worker.intake.drain import drain_shard``."""
