"""zettelq worker: the Celery side that organises memories (see DESIGN.md)."""
