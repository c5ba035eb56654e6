"""A SearchJob to its Reply: retrieval (``retrieve``: read-your-writes through intake's freshness,
lexical and dense channels fused, graph spreading), what a search reads about its candidates in
tiers (``candidates``), the ranking policy (``ranking``, pure), the text ``context()`` returns
(``rendering``) and which search lists a process's threads serve (``routing``). The one edge to
intake is ``intake.freshness``: a search drains an unheld shard inline, which is the feature."""

from worker.search.retrieve import check_deadline, handle, search
from worker.search.routing import Routes

__all__ = ["Routes", "check_deadline", "handle", "search"]
