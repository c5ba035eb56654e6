"""What shapes the graph: the link policy (``linking``) and judges (``judge``, over ``llm``), the
decay every score shares (``decay``), and the periodic per-namespace jobs, each
``<verb>_namespace(ctx, ns) -> int`` and run by ``periodic`` in JOBS order: judge, merge,
supersede (``supersession`` with its pure ``supersession_rule``), consolidate, evolve (drafts in
``proposals``), importance, evict; plus audit and re-embedding. ``pairs`` reads what the jobs that
judge two notes at a time need. Intake applies three of these policies inline (the heuristic
judge, queueing for the LLM judge, the supersession rule); that is why organise/ sits below it.

Nothing is re-exported here: search ranking imports ``organise.decay``, and a search-only
process should not load every job with it. The registry is ``organise.periodic`` (``JOBS``,
``run_periodic``, ``run_job``, ``last_runs``)."""
