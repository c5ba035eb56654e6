"""The CrewAI door on the real crewai package, real Redis and the real worker code (the in-thread
search server): ZettelqStorage's 14 StorageBackend methods, the scope mapping, zettelq_embedder,
and a Memory that recalls with no LLM call. Runs in .venv-crewai (scripts/test-crewai)."""

from __future__ import annotations

import asyncio
import importlib.util
import re
from datetime import datetime, timedelta
from pathlib import Path

import pytest

pytest.importorskip(
    "crewai", reason="needs zettelq[crewai]; scripts/test-crewai runs it in .venv-crewai"
)

from crewai import LLM
from crewai.memory.storage.backend import EmbeddingDimensionMismatchError, StorageBackend
from crewai.memory.storage.factory import set_memory_storage_factory
from crewai.memory.types import MemoryRecord
from crewai.memory.unified_memory import Memory

from producer import InvalidInput, NotFound
from producer.adapters.crewai import (
    SCOPE_TAG,
    ZettelqStorage,
    decode_segment,
    encode_segment,
    namespace_of,
    scope_of_namespace,
    storage_factory,
    zettelq_embedder,
)
from producer.validation import check_namespace
from tests.integration.chat_server import ChatServer, Scripted, chat
from tests.integration.chat_server import answer as answer_json

__all__ = ["chat"]

EXAMPLE = Path(__file__).parents[2] / "examples" / "crewai_crew.py"

FACTS = {
    "/crew/research": "The customer's Snowflake account uses key-pair auth with Azure AD",
    "/crew/research/notes": "Snowflake key-pair rotation happens every 90 days",
    "/crew/researchers": "The research budget for Snowflake tooling is 40k a year",
    "/crew/writer": "The launch blog post goes out on Tuesday at 9am",
}


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    """CrewAI's execution traces are on unless switched off; sent nowhere from tests (each
    remember() would also wait 5 s for the upload to time out)."""
    monkeypatch.setenv("CREWAI_TRACING_ENABLED", "false")
    monkeypatch.setenv("CREWAI_DISABLE_TELEMETRY", "true")


@pytest.fixture
def embedder(client, server):
    return zettelq_embedder(client, "crew")


@pytest.fixture
def depth():
    return 0


#: the tests where scope_depth matters run with each of these
each_depth = pytest.mark.parametrize("depth", [0, 1, 2], ids=["depth0", "depth1", "depth2"])


@pytest.fixture
def storage(client, server, depth):
    st = ZettelqStorage(client, "crew", scope_depth=depth)
    yield st
    st.close()


def record(embedder, content, scope="/", **fields):
    return MemoryRecord(content=content, scope=scope, embedding=embedder([content])[0], **fields)


def saved(storage, embedder, facts=FACTS, **fields):
    records = {scope: record(embedder, text, scope, **fields) for scope, text in facts.items()}
    storage.save(list(records.values()))
    return records


def test_storage_is_a_crewai_storage_backend(storage):
    assert isinstance(storage, StorageBackend)


def test_every_record_field_round_trips_through_get_list_and_search(storage, embedder):
    created = datetime(2026, 11, 2, 3, 4, 5, 678901)
    original = MemoryRecord(
        content="Snowflake key-pair rotation happens every 90 days",
        scope="/crew/research/security",
        categories=["security", "snowflake"],
        metadata={"ticket": "SEC-12", "nested": {"ok": [1, 2.5, None, True]}},
        importance=0.7,
        created_at=created,
        last_accessed=created + timedelta(hours=1),
        embedding=embedder(["Snowflake key-pair rotation happens every 90 days"])[0],
        source="user-42",
        private=True,
    )
    storage.save([original])
    got = storage.get_record(original.id)
    listed = storage.list_records("/crew")
    found = storage.search(original.embedding, scope_prefix="/crew/research")
    for copy in (got, listed[0], found[0][0]):
        assert copy.model_dump() == original.model_dump()
        assert copy.embedding == pytest.approx(original.embedding, abs=1e-7)
    assert found[0][1] == pytest.approx(1.0)


@each_depth
def test_scope_prefix_matches_whole_segments_only(storage, embedder):
    records = saved(storage, embedder)
    research = {records["/crew/research"].id, records["/crew/research/notes"].id}
    assert {r.id for r in storage.list_records("/crew/research")} == research
    assert {r.id for r in storage.list_records("/crew/research/")} == research
    assert storage.count("/crew/research") == 2
    assert storage.count("/crew/researchers") == 1
    assert storage.count("/crew") == 4 and storage.count() == 4 and storage.count("/") == 4
    assert storage.count("/crew/res") == 0
    query = records["/crew/researchers"].embedding
    assert {r.id for r, _ in storage.search(query, scope_prefix="/crew/research")} == research


def test_scopes_map_to_namespaces_reversibly_within_the_namespace_rules():
    for segment in ["team", "a.b:c-d_e", "Research Crew", "café", "50%", "a@b", "日本", "@40@"]:
        encoded = encode_segment(segment)
        assert decode_segment(encoded) == segment
        assert check_namespace(f"crew/{encoded}") == f"crew/{encoded}"
    segments = ("Research Crew", "a@b", "x")
    ns = namespace_of("crew", segments, 2)
    assert ns == "crew/Research@20@Crew/a@40@b"
    assert scope_of_namespace("crew", ns) == segments[:2]
    assert scope_of_namespace("crew", "crew") == ()
    assert scope_of_namespace("crew", "crews/x") is None
    with pytest.raises(InvalidInput, match="namespace"):
        namespace_of("crew", ("x" * 130,), 1)


@each_depth
def test_records_live_in_the_namespace_of_their_leading_segments(client, storage, embedder, depth):
    records = saved(storage, embedder)
    rec = records["/crew/research/notes"]
    ns = "/".join(["crew", *["crew", "research", "notes"][:depth]])
    client.flush(ns)
    note = client.get(rec.id, namespace=ns)
    assert note.content == rec.content
    assert note.importance == rec.importance and note.agent is None
    scope_tags = [t for t in note.tags if t.startswith(SCOPE_TAG)]
    assert len(scope_tags) == 3 - depth


@each_depth
def test_search_scores_are_in_0_1_descending_and_respect_min_score(storage, embedder):
    saved(storage, embedder)
    query = embedder(["Snowflake key-pair auth"])[0]
    found = storage.search(query, limit=10)
    scores = [s for _, s in found]
    assert len(found) >= 2
    assert all(0.0 < s <= 1.0 for s in scores)
    assert scores == sorted(scores, reverse=True)
    cut = (scores[0] + scores[-1]) / 2
    kept = storage.search(query, limit=10, min_score=cut)
    assert kept and all(s >= cut for _, s in kept)
    assert len(kept) < len(found)
    assert len(storage.search(query, limit=1)) == 1
    with pytest.raises(InvalidInput, match="min_score"):
        storage.search(query, min_score=1.5)


def test_search_with_a_foreign_vector_compares_every_record_in_scope(storage, embedder):
    records = saved(storage, embedder)
    foreign = [x + 1e-4 for x in records["/crew/writer"].embedding]
    found = storage.search(foreign, scope_prefix="/crew", limit=2)
    assert found[0][0].id == records["/crew/writer"].id
    assert found[0][1] > found[1][1]
    with pytest.raises(EmbeddingDimensionMismatchError):
        storage.search([0.1, 0.2, 0.3])


def test_search_filters_categories_any_and_metadata_all(storage, embedder):
    records = saved(storage, embedder, categories=["general"], metadata={"team": "a"})
    special = record(
        embedder,
        "Snowflake warehouses suspend after 5 idle minutes",
        "/crew/research",
        categories=["ops", "snowflake"],
        metadata={"team": "b", "tier": 1},
    )
    storage.save([special])
    query = embedder(["Snowflake"])[0]
    assert [r.id for r, _ in storage.search(query, categories=["ops", "nope"])] == [special.id]
    assert [r.id for r, _ in storage.search(query, metadata_filter={"team": "b"})] == [special.id]
    assert storage.search(query, metadata_filter={"team": "b", "tier": 2}) == []
    team_a = {r.id for r, _ in storage.search(query, metadata_filter={"team": "a"})}
    assert special.id not in team_a and records["/crew/research"].id in team_a


@each_depth
def test_delete_counts_exactly_and_tombstones_through_the_worker(client, storage, embedder, depth):
    records = saved(storage, embedder, categories=["keep"])
    old = record(
        embedder,
        "Snowflake key-pair auth was set up by the old team",
        "/crew/research",
        categories=["stale"],
        created_at=datetime(2020, 1, 1),
        metadata={"team": "old"},
    )
    storage.save([old])
    ns = "/".join(["crew", "crew", "research"][: depth + 1])
    client.flush(ns)
    linked = client.get(records["/crew/research"].id, namespace=ns).links
    assert storage.delete(older_than=datetime(2021, 1, 1)) == 1
    assert storage.delete(older_than=datetime(2021, 1, 1)) == 0
    with pytest.raises(NotFound):
        client.get(old.id, namespace=ns)
    survivor = client.get(records["/crew/research"].id, namespace=ns)
    assert old.id not in survivor.links and set(survivor.links) <= set(linked)
    assert client.stats(ns).tombstoned >= 1
    assert storage.delete(record_ids=[records["/crew/writer"].id, "missing", "bad id!"]) == 1
    assert storage.delete(scope_prefix="/crew/research", categories=["nope"]) == 0
    assert storage.delete(scope_prefix="/crew/research") == 2
    assert storage.delete(metadata_filter={"team": "old"}) == 0
    assert storage.count() == 1
    assert storage.get_record(records["/crew/research"].id) is None


def test_reset_tombstones_a_scope_then_everything(storage, embedder):
    saved(storage, embedder)
    storage.reset("/crew/research")
    assert storage.count() == 2 and storage.count("/crew/research") == 0
    storage.reset()
    assert storage.count() == 0 and storage.list_scopes("/") == []


@each_depth
def test_update_replaces_the_same_record_even_across_namespaces(client, storage, embedder):
    records = saved(storage, embedder)
    rec = records["/crew/writer"]
    moved = rec.model_copy(update={"content": "The launch post moved to Thursday", "scope": "/x"})
    storage.update(moved)
    assert storage.get_record(rec.id).content == "The launch post moved to Thursday"
    assert storage.count("/crew/writer") == 0 and storage.count("/x") == 1
    assert storage.count() == 4


@each_depth
def test_touch_records_counts_a_retrieval_as_a_search_hit_does(client, storage, embedder, depth):
    records = saved(storage, embedder)
    rec = records["/crew/writer"]
    ns = "/".join(["crew", "crew", "writer"][: depth + 1])
    client.flush(ns)
    before = client.get(rec.id, namespace=ns)
    assert storage.search(rec.embedding, limit=3)[0][0].id == rec.id
    assert client.get(rec.id, namespace=ns).access_count == before.access_count
    storage.touch_records([rec.id, rec.id, "missing"])
    after = client.get(rec.id, namespace=ns)
    assert after.access_count == before.access_count + 1
    assert after.last_access > before.last_access
    assert storage.get_record(rec.id).last_accessed > rec.last_accessed


def test_list_records_pages_newest_first(storage, embedder):
    start = datetime(2026, 1, 1)
    records = [
        record(
            embedder, f"Release {i} shipped", "/crew/writer", created_at=start + timedelta(days=i)
        )
        for i in range(5)
    ]
    storage.save(records[::2] + records[1::2])
    newest_first = [r.id for r in reversed(records)]
    assert [r.id for r in storage.list_records()] == newest_first
    assert [r.id for r in storage.list_records("/crew", limit=2, offset=1)] == newest_first[1:3]
    assert storage.list_records(offset=5) == [] and storage.list_records(limit=0) == []


@each_depth
def test_scope_info_scopes_and_categories(storage, embedder):
    saved(storage, embedder, categories=["shared"])
    storage.save([record(embedder, "Tuesday works", "/crew/writer/drafts", categories=["dates"])])
    info = storage.get_scope_info("/crew")
    assert info.path == "/crew" and info.record_count == 5
    assert info.categories == ["dates", "shared"]
    assert info.child_scopes == ["/crew/research", "/crew/researchers", "/crew/writer"]
    assert info.oldest_record <= info.newest_record
    assert storage.get_scope_info("/crew/writer/").child_scopes == ["/crew/writer/drafts"]
    assert storage.get_scope_info("/nowhere").record_count == 0
    assert storage.list_scopes() == ["/crew"]
    assert storage.list_scopes("/crew/research") == ["/crew/research/notes"]
    assert storage.list_categories() == {"shared": 4, "dates": 1}
    assert storage.list_categories("/crew/writer") == {"shared": 1, "dates": 1}


def test_async_methods_do_what_their_twins_do(storage, embedder):
    records = [record(embedder, text, scope) for scope, text in FACTS.items()]

    async def run():
        await storage.asave(records)
        found = await storage.asearch(records[0].embedding, scope_prefix="/crew", limit=2)
        deleted = await storage.adelete(scope_prefix="/crew/writer")
        return found, deleted

    found, deleted = asyncio.run(run())
    assert found[0][0].id == records[0].id and deleted == 1
    assert storage.count() == 3


def test_bad_records_are_refused_before_anything_is_written(storage, embedder):
    with pytest.raises(InvalidInput, match="_crewai"):
        storage.save([record(embedder, "x", metadata={"_crewai": 1})])
    with pytest.raises(InvalidInput, match="id"):
        storage.save([MemoryRecord(id="not an id!", content="x")])
    assert storage.count() == 0


def test_zettelq_embedder_returns_the_workers_vectors(client, ctx, server):
    embed = zettelq_embedder(client)
    texts = ["Snowflake key-pair auth", "the launch is on Tuesday"]
    vectors = embed(texts)
    expected = ctx.embedder.embed(texts)
    assert [len(x) for x in vectors] == [ctx.embedder.dim] * 2
    assert vectors == [pytest.approx(row.tolist(), abs=1e-7) for row in expected]
    with pytest.raises(InvalidInput, match="texts"):
        client.embed([])
    with pytest.raises(InvalidInput, match="text"):
        client.embed(["  "])


def test_memory_recalls_a_stored_fact_with_no_llm_call(client, server, chat: ChatServer):
    llm = LLM(model="openai/gpt-4o-mini", base_url=chat.url, api_key="unused")
    memory = Memory(
        llm=llm,
        storage=ZettelqStorage(client, "crew"),
        embedder=zettelq_embedder(client, "crew"),
    )
    fact = "The customer's Snowflake account uses key-pair auth with Azure AD"
    memory.remember(fact, scope="/crew/research", categories=["auth"], importance=0.8)
    memory.remember(
        "The launch blog post goes out on Tuesday",
        scope="/crew/writer",
        categories=["launch"],
        importance=0.5,
    )
    for depth in ("shallow", "deep"):
        matches = memory.recall("How does Snowflake authenticate?", depth=depth, limit=3)
        assert matches[0].record.content == fact
    assert (
        memory.recall("Snowflake auth", scope="/crew/writer", depth="shallow")[0].record.scope
        == "/crew/writer"
    )
    memory.close()
    assert chat.requests == []


def test_a_zettelq_spec_routes_through_the_storage_factory(client, server):
    factory = storage_factory(client)
    assert factory("lancedb") is None
    set_memory_storage_factory(factory)
    try:
        memory = Memory(
            storage="zettelq://crew/team?scope_depth=1", embedder=zettelq_embedder(client)
        )
    finally:
        set_memory_storage_factory(None)
    backend = memory._storage
    assert isinstance(backend, ZettelqStorage)
    assert (backend.namespace, backend.scope_depth) == ("crew/team", 1)
    with pytest.raises(InvalidInput, match="scope_depth"):
        factory("zettelq://crew?scope_depth=x")


ANSWERS = {
    "You are researcher": "The customer's Snowflake account uses key-pair auth with Azure AD.",
    "You are analyst": "The customer's Snowflake keys are rotated every 90 days.",
    "You are writer": "Snowflake: key-pair auth with Azure AD, keys rotated every 90 days.",
}


def crew_llm(request):
    """Each agent's answer; CrewAI's memory analysis gets the agent's answer as the memory to
    keep (extraction) and a scope, categories and importance for it (save analysis)."""
    system = request["messages"][0]["content"]
    user = request["messages"][-1]["content"]
    for marker, answer in ANSWERS.items():
        if marker in system:
            return Scripted(answer)
    if "Result: " in user:
        result = user.split("Result: ", 1)[1].splitlines()[0].strip()
        return answer_json({"memories": [result]})
    return answer_json(
        {
            "suggested_scope": "/facts",
            "categories": ["snowflake"],
            "importance": 0.6,
            "extracted_metadata": {"entities": ["Snowflake"], "dates": [], "topics": []},
        }
    )


def test_the_crew_example_shares_memories_between_agents(client, server, chat: ChatServer):
    spec = importlib.util.spec_from_file_location("crewai_crew", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    chat.responder = crew_llm
    llm = LLM(model="openai/gpt-4o-mini", base_url=chat.url, api_key="unused")
    crew = example.build_crew(client, llm)
    result = crew.kickoff()
    crew.memory.drain_writes()
    assert result.raw == ANSWERS["You are writer"]
    writer = [r for r in chat.requests if "You are writer" in r["messages"][0]["content"]]
    prompt = "\n".join(m["content"] for m in writer[0]["messages"])
    assert "key-pair auth" in prompt and "90 days" in prompt
    stored = client.search("Snowflake keys rotated", namespace=example.NAMESPACE, k=10)
    contents = {h.content for h in stored}
    assert {ANSWERS["You are researcher"], ANSWERS["You are analyst"]} <= contents, contents
    assert {h.metadata["_crewai"]["scope"] for h in stored} == {"/facts"}


def test_the_readme_crewai_example_runs_as_written(settings, server, monkeypatch, capsys):
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    code = re.search(r"## CrewAI.*?```python\n(.*?)```", readme, re.S)
    assert code is not None
    monkeypatch.setenv("ZQ_REDIS_URL", settings.redis_url)
    monkeypatch.setenv("ZQ_KEY_PREFIX", settings.key_prefix)
    monkeypatch.setenv("ZQ_SHARD_COUNT", str(settings.shard_count))
    exec(compile(code.group(1), "README CrewAI", "exec"), {})
    assert capsys.readouterr().out == "Snowflake keys rotate every 90 days\n"
