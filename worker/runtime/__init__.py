"""The processes: the Celery app and its configuration (``celery_app``), what each process holds
and starts (``process``: its context and the signal hooks), the tasks (``tasks``, with stable
``zq.*`` names), beat's scheduler (``beat``) and schedule (``schedule``), the threads that serve
searches (``servers``) and organise() requests (``organiser``), the snapshotter, the process
heartbeats, the Redis version check (``redis_config``) and the development Redis (``devserver``).

Nothing is re-exported here: importing ``worker.runtime.celery_app`` builds the app from the
environment, and ``python -m worker.runtime.devserver`` must start without it."""
