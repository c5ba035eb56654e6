"""LangGraph's long-term memory store on zettelq (extra ``zettelq[langgraph]``).

``ZettelqStore(MemoryClient(...))`` and ``AsyncZettelqStore(AsyncMemoryClient(...))`` are
``langgraph.store.base.BaseStore`` implementations for ``graph.compile(store=...)``. An item is
one note: namespace tuple -> zettelq namespace (``encode_namespace``), key -> a stable note id
(``note_id``), value -> the note's metadata (kept exactly), the text at the index paths -> the
note's content. ``store`` does the I/O, ``mapping`` and ``query`` are pure; docs/langgraph.md has
the whole contract (what is supported, consistency, limits).
"""

from __future__ import annotations

try:
    import langgraph.store.base  # noqa: F401  (the extra's check, before the modules need it)
except ImportError as exc:
    raise ImportError(
        "the zettelq LangGraph store needs LangGraph: pip install 'zettelq[langgraph]'"
    ) from exc

from producer.adapters.langgraph.mapping import decode_namespace, encode_namespace, note_id
from producer.adapters.langgraph.store import AsyncZettelqStore, ZettelqStore

__all__ = ["AsyncZettelqStore", "ZettelqStore", "decode_namespace", "encode_namespace", "note_id"]
