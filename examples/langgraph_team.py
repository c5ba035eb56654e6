"""Three LangGraph agents share one zettelq namespace through ZettelqStore.

A researcher writes what it found, a planner reads the researcher's findings and writes a
plan, a reviewer reads everyone's notes and signs the plan off. Each agent is a graph node with
no LLM; each writes fire-and-forget (a put is one Redis round trip and never waits on a worker)
and reads the others' memories through the store LangGraph injects (``runtime.store``).

Run it with a worker organising the notes, e.g. ``zettelq dev`` in another terminal, then::

    pip install 'zettelq[langgraph]'
    python examples/langgraph_team.py

It reads ZQ_REDIS_URL (default redis://127.0.0.1:6379/0) like every zettelq client;
tests/adapters/test_langgraph_example.py runs it.
"""

from __future__ import annotations

import operator
from typing import Annotated, TypedDict

from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.runtime import Runtime

from producer import MemoryClient
from producer.adapters.langgraph import ZettelqStore

TEAM = ("acme", "snowflake-migration")  #: the namespace the three agents share


class Board(TypedDict):
    log: Annotated[list[str], operator.add]


def researcher(state: Board, runtime: Runtime) -> Board:
    store = runtime.store
    assert store is not None
    findings = {
        "auth": "Snowflake uses key-pair auth with Azure AD",
        "rotation": "Snowflake key-pair rotation happens every 90 days",
        "warehouse": "The reporting warehouse is sized X-Small",
    }
    for key, text in findings.items():
        store.put(TEAM, f"finding-{key}", {"content": text, "by": "researcher"})
    return {"log": [f"researcher: stored {len(findings)} findings"]}


def planner(state: Board, runtime: Runtime) -> Board:
    store = runtime.store
    assert store is not None
    hits = store.search(TEAM, query="key-pair auth rotation", filter={"by": "researcher"}, limit=2)
    basis = [h.value["content"] for h in hits]
    plan = "Rotate the Snowflake key pair before cut-over; " + "; ".join(basis)
    store.put(TEAM, "plan", {"content": plan, "by": "planner", "based_on": [h.key for h in hits]})
    return {"log": [f"planner: read {', '.join(sorted(h.key for h in hits))}; wrote plan"]}


def reviewer(state: Board, runtime: Runtime) -> Board:
    store = runtime.store
    assert store is not None
    plan = store.get(TEAM, "plan")
    everything = store.search(TEAM, limit=20)
    authors = sorted({item.value["by"] for item in everything})
    verdict = "approved" if plan and plan.value["based_on"] else "rejected"
    store.put(TEAM, "review", {"content": f"plan {verdict}", "by": "reviewer"})
    return {"log": [f"reviewer: read {len(everything)} notes by {', '.join(authors)}; {verdict}"]}


def build(store: ZettelqStore) -> CompiledStateGraph[Board, None, Board, Board]:
    graph = StateGraph(Board)
    graph.add_node("researcher", researcher)
    graph.add_node("planner", planner)
    graph.add_node("reviewer", reviewer)
    graph.add_edge(START, "researcher")
    graph.add_edge("researcher", "planner")
    graph.add_edge("planner", "reviewer")
    graph.add_edge("reviewer", END)
    return graph.compile(store=store)


def main() -> None:
    with MemoryClient() as client:
        store = ZettelqStore(client, agent="team")
        app = build(store)
        result = app.invoke({"log": []})
        for line in result["log"]:
            print(line)
        review = store.get(TEAM, "review")
        print("review:", review.value["content"] if review else "missing")
        store.close()


if __name__ == "__main__":
    main()
