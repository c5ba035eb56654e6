"""JSONL export and import (docs/transfer.md) against the real Redis, with the real worker code:
a LoCoMo conversation organised (links, merges, supersession, insights, importance), exported,
imported into another namespace and compared field by field, links included; a second import
adds nothing; an import stopped by a bad line mid-file and run again duplicates nothing; the
plain-text, content-JSONL and mem0 mappings; atomic notes; signatures; the worker refuses a
malformed restore job; the CLI (summary, bad lines, progress bar, --wait, a SIGKILLed run)."""

from __future__ import annotations

import io
import json
import os
import pty
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import msgpack
import pytest

from bench.locomo import load_conversation
from producer import MemoryClient, NotFound
from producer.protocol import pack, unpack_link
from tests.conftest import drain_all, make_settings
from tests.integration.chat_server import answer_with, chat
from tests.integration.test_construction import LONG, build, describe
from worker.cli.main import main
from worker.context import WorkerContext
from worker.intake import construction
from worker.organise.periodic import run_job
from worker.store import notes
from worker.store.integrity import check_namespace
from worker.transfer.export import LOCAL_FIELDS, export_lines
from worker.transfer.importer import ImportLineError, content_id, import_stream

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(__file__).resolve().parents[3] / "shared" / "data" / "locomo-dev" / "30.json"
#: every periodic job that changes the graph without an LLM (judge needs one; evict drops notes)
JOBS = ("merge", "supersede", "consolidate", "evolve", "importance")
DUPLICATE = "Melanie: I ran a charity race for mental health last Saturday."
T0 = 1_767_225_600.0  #: 2026-01-01 UTC
REACT = "We chose React for the frontend because the team knows it well."
SVELTE = "We are switching the frontend to Svelte for better performance."

__all__ = ["chat"]


def organised_conversation(ctx, client, ns: str = "src") -> list[dict[str, Any]]:
    """LoCoMo conversation 30 stored, organised and run through the periodic jobs, plus a
    duplicate (merged), a changed fact (superseded) and notes with importance and tags."""
    turns, _ = load_conversation(DATA)
    for start in range(0, len(turns), 200):
        client.store_many(turns[start : start + 200], namespace=ns)
    client.store_many(
        [
            {"id": "dup-a", "content": DUPLICATE, "tags": ["race"], "importance": 0.9},
            {"id": "dup-b", "content": DUPLICATE, "metadata": {"n": [1, {"x": None}]}},
            {"id": "react", "content": REACT, "agent": "Caroline", "event_time": T0},
        ],
        namespace=ns,
    )
    drain_all(ctx)
    client.store(SVELTE, id="svelte", event_time=T0 + 86_400, namespace=ns)
    drain_all(ctx)
    for job in JOBS:
        run_job(ctx, job, ns)
    return turns


def exported(r, keys, ns: str) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    lines = list(export_lines(r, keys, ns))
    return lines[0], {rec["id"]: rec for rec in lines[1:]}


def export_file(r, keys, ns: str) -> bytes:
    return b"".join(json.dumps(line).encode() + b"\n" for line in export_lines(r, keys, ns))


def hash_values(r, keys, ns: str, nid: str) -> dict[str, Any]:
    """A note hash without the namespace's own fields, numbers compared as numbers."""
    out: dict[str, Any] = {}
    for k, raw in r.hgetall(keys.note(ns, nid)).items():
        key = k.decode()
        if key not in LOCAL_FIELDS:
            value = notes.decode_field(key, raw)
            try:
                out[key] = float(value) if isinstance(value, str) else value
            except ValueError:
                out[key] = value
    return out


def links_of(r, keys, ns: str, nid: str) -> dict[bytes, tuple[float, dict[str, Any]]]:
    """A note's links hash unpacked: neighbour -> (weight, metadata)."""
    return {nb: unpack_link(raw) for nb, raw in r.hgetall(keys.links(ns, nid)).items()}


@pytest.mark.skipif(not DATA.exists(), reason=f"LoCoMo sample not found at {DATA}")
def test_round_trip_of_an_organised_conversation_is_equal_field_by_field(
    settings, ctx, client, server
):
    organised_conversation(ctx, client)
    for query in ("charity race", "frontend", "adoption agency"):
        client.search(query, namespace="src", k=3)  # access counts and times
    client.flush("src")  # served after those searches: their access counts are written
    r, keys = ctx.redis, ctx.keys
    head, before = exported(r, keys, "src")
    assert head["zettelq_export"] == 1 and head["namespace"] == "src"
    assert head["count"] == len(before) and head["embedder"] == ctx.embedder.name
    assert head["dims"] == ctx.embedder.dim
    # the conversation exercised what the format has to carry
    assert before["dup-b"]["status"] == "tombstoned" and before["dup-b"]["merged_into"] == "dup-a"
    assert "dup-b" in before["dup-a"]["merged_from"]
    assert before["react"]["superseded_by"] == "svelte" and "valid_to" in before["react"]
    assert any(rec["kind"] == "insight" and rec.get("cluster") for rec in before.values())
    assert any(link.get("back") for rec in before.values() for link in rec["links"])
    assert sum(len(rec["links"]) for rec in before.values()) > len(before)
    assert any(rec["access_count"] for rec in before.values())

    summary = import_stream(settings, "dst", io.BytesIO(export_file(r, keys, "src")))
    assert summary.as_dict() == {
        "read": len(before),
        "imported": len(before),
        "skipped": 0,
        "errors": 0,
        "format": "zettelq",
    }
    drain_all(ctx)

    _, after = exported(r, keys, "dst")
    assert after.keys() == before.keys()
    for nid in before:
        assert after[nid] == before[nid], nid
        assert hash_values(r, keys, "dst", nid) == hash_values(r, keys, "src", nid), nid
        assert links_of(r, keys, "dst", nid) == links_of(r, keys, "src", nid), nid
    assert r.hgetall(keys.clusters("dst")) == r.hgetall(keys.clusters("src"))
    assert client.stats("dst").links == client.stats("src").links
    assert client.stats("dst").notes == client.stats("src").notes
    assert check_namespace(ctx, "dst") == []
    assert client.get("dup-b", namespace="dst").id == "dup-a"  # a merged id finds its survivor
    assert client.get("react", namespace="dst").superseded_by == "svelte"


def test_restored_notes_are_searchable_and_audited(settings, ctx, client, server):
    client.store_many(["Alice plays the cello.", "Bob repairs old bicycles."], namespace="src")
    drain_all(ctx)
    import_stream(settings, "dst", io.BytesIO(export_file(ctx.redis, ctx.keys, "src")))
    drain_all(ctx)
    hits = client.search("cello", namespace="dst", k=1)
    assert hits[0].content == "Alice plays the cello."
    audit = ctx.redis.xrange(ctx.keys.audit("dst"))
    assert [e[b"op"] for _, e in audit] == [b"restore", b"restore"]
    assert {e[b"source"].decode().split(":")[0] for _, e in audit} == {"import"}


def test_a_second_import_adds_nothing(settings, ctx, client):
    client.store_many(
        [{"id": f"n{i}", "content": f"fact number {i} about rivers"} for i in range(30)],
        namespace="src",
    )
    drain_all(ctx)
    data = export_file(ctx.redis, ctx.keys, "src")
    import_stream(settings, "dst", io.BytesIO(data))
    drain_all(ctx)
    stats, audit = client.stats("dst"), ctx.redis.xlen(ctx.keys.audit("dst"))

    again = import_stream(settings, "dst", io.BytesIO(data))
    assert (again.imported, again.skipped, again.read) == (0, 30, 30)
    assert drain_all(ctx) == 0
    assert client.stats("dst").notes == stats.notes and client.stats("dst").links == stats.links
    assert ctx.redis.xlen(ctx.keys.audit("dst")) == audit


def test_restores_queued_twice_before_a_worker_ran_write_each_note_once(settings, ctx, client):
    """An import interrupted after queueing and run again before the worker caught up queues
    the same restores twice: the worker writes each id once and each link once."""
    client.store_many([f"the lake is frozen, day {i}" for i in range(20)], namespace="src")
    drain_all(ctx)
    data = export_file(ctx.redis, ctx.keys, "src")
    first = import_stream(settings, "dst", io.BytesIO(data))
    second = import_stream(settings, "dst", io.BytesIO(data))
    assert first.imported == second.imported == 20  # nothing organised yet: both queued all
    drain_all(ctx)
    assert ctx.redis.zcard(ctx.keys.active("dst")) == 20
    assert int(ctx.redis.get(ctx.keys.seq("dst"))) == 20  # one seq per note: none twice
    assert client.stats("dst").links == client.stats("src").links
    assert exported(ctx.redis, ctx.keys, "dst")[1] == exported(ctx.redis, ctx.keys, "src")[1]


def test_an_import_stopped_by_a_bad_line_resumes_without_duplicates(settings, ctx, client):
    client.store_many([f"note {i} on glaciers and ice" for i in range(40)], namespace="src")
    drain_all(ctx)
    lines = export_file(ctx.redis, ctx.keys, "src").splitlines(keepends=True)
    broken = [*lines[:21], b'{"id": "x", "content": 3}\n', *lines[21:]]

    summary = import_stream(settings, "dst", io.BytesIO(b"".join(broken)), batch=7)
    assert isinstance(summary.failure, ImportLineError) and summary.failure.line == 22
    assert "content" in str(summary.failure)
    assert (summary.imported, summary.errors) == (20, 1)
    drain_all(ctx)
    assert ctx.redis.zcard(ctx.keys.active("dst")) == 20

    rerun = import_stream(settings, "dst", io.BytesIO(b"".join(lines)), batch=7)
    assert (rerun.imported, rerun.skipped, rerun.failure) == (20, 20, None)
    drain_all(ctx)
    assert ctx.redis.zcard(ctx.keys.active("dst")) == 40
    assert int(ctx.redis.get(ctx.keys.seq("dst"))) == 40
    assert exported(ctx.redis, ctx.keys, "dst")[1] == exported(ctx.redis, ctx.keys, "src")[1]


def test_skip_errors_counts_bad_lines_and_imports_the_rest(settings, ctx):
    text = b'{"content": "one"}\nnot json\n{"content": "two", "colour": "red"}\n{"content": "3"}\n'
    summary = import_stream(settings, "ns", io.BytesIO(text), fmt="jsonl", skip_errors=True)
    assert summary.as_dict() == {
        "read": 4,
        "imported": 2,
        "skipped": 0,
        "errors": 2,
        "format": "jsonl",
    }
    drain_all(ctx)
    assert ctx.redis.zcard(ctx.keys.active("ns")) == 2


def test_plain_text_lines_become_organised_notes_with_ids_from_their_content(settings, ctx, client):
    ada = "Ada wrote the first program."
    text = f"{ada}\n\nBabbage designed the engine.\n{ada}\n"
    summary = import_stream(settings, "ns", io.BytesIO(text.encode()))
    assert (summary.format, summary.read, summary.imported, summary.skipped) == ("text", 3, 2, 1)
    drain_all(ctx)
    note = client.get(content_id(ada), namespace="ns")
    assert note.content == ada and note.keywords  # organised
    again = import_stream(settings, "ns", io.BytesIO(text.encode()))
    assert (again.imported, again.skipped) == (0, 3)


def test_content_jsonl_keeps_the_store_fields_it_gives(settings, ctx, client):
    line = {"id": "j1", "content": "Tea at five.", "tags": ["habit"], "agent": "a", "importance": 1}
    import_stream(settings, "ns", io.BytesIO(json.dumps(line).encode()))
    drain_all(ctx)
    note = client.get("j1", namespace="ns")
    assert (note.content, note.agent, note.importance) == ("Tea at five.", "a", 1.0)
    assert "habit" in note.tags


def test_mem0_get_all_output_maps_memory_metadata_agent_and_times(settings, ctx, client):
    doc = {
        "results": [
            {
                "id": "3c90c3cc-0d44-4b50-8888-8dd25736052a",
                "memory": "Likes hiking in the Alps",
                "hash": "abc",
                "metadata": {"source": "chat"},
                "created_at": "2024-07-20T02:30:00-07:00",
                "updated_at": "2024-07-21T10:00:00+00:00",
                "user_id": "alice",
                "categories": ["hobbies"],
            },
            {"id": "not an id!", "memory": "Is vegetarian", "agent_id": "planner"},
            {"memory": 7},
        ]
    }
    summary = import_stream(
        settings, "ns", io.BytesIO(json.dumps(doc, indent=2).encode()), skip_errors=True
    )
    assert (summary.format, summary.imported, summary.errors) == ("mem0", 2, 1)
    drain_all(ctx)
    hike = client.get("3c90c3cc-0d44-4b50-8888-8dd25736052a", namespace="ns")
    assert hike.content == "Likes hiking in the Alps" and hike.agent == "alice"
    assert hike.metadata["source"] == "chat"
    assert hike.metadata["mem0"]["updated_at"] == "2024-07-21T10:00:00+00:00"
    assert hike.event_time == 1721467800.0 and "hobbies" in hike.tags
    veg = client.get(content_id("Is vegetarian"), namespace="ns")
    assert veg.agent == "planner"


def test_an_export_of_another_version_is_refused_before_anything_is_queued(settings, ctx):
    data = b'{"zettelq_export": 2, "namespace": "x"}\n{"id": "a", "content": "c"}\n'
    with pytest.raises(ImportLineError, match="line 1: export format version 2"):
        import_stream(settings, "ns", io.BytesIO(data))
    assert drain_all(ctx) == 0


def test_the_worker_dead_letters_a_restore_job_outside_the_limits(settings, ctx, client):
    """A restore job queued by anyone is checked again by the worker: untrusted input."""
    job = {"v": 1, "op": "restore", "id": "evil", "ns": "ns", "content": "x", "created_at": 1.0}
    inbox = ctx.keys.inbox(ctx.keys.shard_of("ns"))
    for bad in ({"kind": "root"}, {"links": [{"target": "a b", "weight": 1.0}]}, {"version": 0}):
        ctx.redis.xadd(inbox, {"j": pack({**job, **bad})})
    drain_all(ctx)
    reasons = [e[b"reason"].decode() for _, e in ctx.redis.xrange(ctx.keys.dead())]
    assert len(reasons) == 3 and "kind" in reasons[0] and "id" in reasons[1]
    with pytest.raises(NotFound):
        client.get("evil", namespace="ns")
    assert msgpack.unpackb(ctx.redis.xrange(ctx.keys.dead())[0][1][b"payload"])["id"] == "evil"


# ------------------------------------------------------------------------------------- CLI


def test_cli_export_then_import_prints_a_json_summary(cli_env, ctx, client, capsys, tmp_path):
    client.store_many([f"a walk by the sea, day {i}" for i in range(12)], namespace="src")
    drain_all(ctx)
    assert main(["export", "src"]) == 0
    dump = capsys.readouterr().out
    assert json.loads(dump.splitlines()[0])["count"] == 12
    path = tmp_path / "notes.jsonl"
    path.write_text(dump)

    assert main(["import", "dst", str(path), "--no-progress"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out) == {
        "read": 12,
        "imported": 12,
        "skipped": 0,
        "errors": 0,
        "format": "zettelq",
    }
    assert err == ""
    drain_all(ctx)
    assert exported(ctx.redis, ctx.keys, "dst")[1] == exported(ctx.redis, ctx.keys, "src")[1]

    assert main(["export", "dst", "--out", str(tmp_path / "dst.jsonl")]) == 0
    assert json.loads(capsys.readouterr().out)["exported"] == 12
    assert len((tmp_path / "dst.jsonl").read_text().splitlines()) == 13


def test_cli_import_stops_at_a_bad_line_with_its_number(cli_env, ctx, capsys, tmp_path):
    path = tmp_path / "notes.txt"
    path.write_bytes(b'{"content": "one"}\n{"content": "two"}\n{"content": ""}\n{"content": "x"}\n')
    assert main(["import", "ns", str(path)]) == 2
    out, err = capsys.readouterr()
    assert json.loads(out)["imported"] == 2 and json.loads(out)["errors"] == 1
    assert err.startswith("zettelq: error: line 3: content must not be empty")

    drain_all(ctx)
    assert main(["import", "ns", str(path), "--skip-errors"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert (again["imported"], again["skipped"], again["errors"]) == (1, 2, 1)


def zettelq_env(settings, **more: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZQ_")}
    for name in ("redis_url", "key_prefix", "shard_count"):
        env[f"ZQ_{name.upper()}"] = str(getattr(settings, name))
    return {**env, **more}


def test_the_progress_bar_shows_on_a_terminal_only(settings, tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("".join(f"line {i} of a diary\n" for i in range(50)))
    for extra, shown in (([], True), (["--no-progress"], False)):
        leader, follower = pty.openpty()
        with subprocess.Popen(
            [sys.executable, "-m", "worker.cli.main", "import", f"p{shown}", str(path), *extra],
            env=zettelq_env(settings, TERM="xterm"),  # a terminal that draws, whatever runs this
            stdout=subprocess.PIPE,
            stderr=follower,
            cwd=ROOT,
        ) as proc:
            os.close(follower)
            out = proc.communicate(timeout=60)[0]
        screen = read_all(leader)
        assert proc.returncode == 0, screen
        assert json.loads(out)["imported"] == 50
        assert ("importing" in screen) is shown, screen


def read_all(fd: int) -> str:
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 4096)
        except OSError:  # the terminal closed (EIO on Linux)
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(fd)
    return b"".join(chunks).decode(errors="replace")


def test_an_import_killed_halfway_and_run_again_duplicates_nothing(settings, ctx, client, tmp_path):
    """A real ``zettelq import`` process is SIGKILLed while it waits on a full inbox (no worker
    runs), then run again once a worker drained what it had queued."""
    client.store_many([f"a note on tides number {i}" for i in range(120)], namespace="src")
    drain_all(ctx)
    path = tmp_path / "notes.jsonl"
    path.write_bytes(export_file(ctx.redis, ctx.keys, "src"))
    cmd = [sys.executable, "-m", "worker.cli.main", "import", "dst", str(path), "--batch", "10"]
    inbox = ctx.keys.inbox(ctx.keys.shard_of("dst"))
    with subprocess.Popen(cmd, env=zettelq_env(settings, ZQ_MAX_PENDING="40"), cwd=ROOT) as proc:
        deadline = time.monotonic() + 30
        while ctx.redis.xlen(inbox) < 40 and time.monotonic() < deadline:
            time.sleep(0.05)  # a real process: wait until it has queued what the bound lets in
        proc.kill()
    assert ctx.redis.xlen(inbox) == 40
    drain_all(ctx)
    assert ctx.redis.zcard(ctx.keys.active("dst")) == 40

    rerun = subprocess.run(
        cmd, env=zettelq_env(settings), cwd=ROOT, capture_output=True, timeout=60
    )
    assert rerun.returncode == 0, rerun.stderr
    assert json.loads(rerun.stdout) == {
        "read": 120,
        "imported": 80,
        "skipped": 40,
        "errors": 0,
        "format": "zettelq",
    }
    drain_all(ctx)
    assert ctx.redis.zcard(ctx.keys.active("dst")) == int(ctx.redis.get(ctx.keys.seq("dst"))) == 120
    assert ctx.redis.xlen(ctx.keys.audit("dst")) == 120
    assert exported(ctx.redis, ctx.keys, "dst")[1] == exported(ctx.redis, ctx.keys, "src")[1]


def test_restore_jobs_carry_the_namespace_signature_a_worker_requires(redis_db, tmp_path):
    keyed = make_settings(
        tmp_path, require_signatures=True, namespace_keys={"src": "k1", "dst": "k2"}
    )
    unkeyed = keyed.model_copy(update={"namespace_keys": {}})
    ctx = WorkerContext.build(keyed)
    try:
        with MemoryClient(keyed) as mem:
            mem.store_many(["signed note one", "signed note two"], namespace="src")
        drain_all(ctx)
        data = export_file(ctx.redis, ctx.keys, "src")
        import_stream(keyed, "dst", io.BytesIO(data))
        import_stream(unkeyed, "other", io.BytesIO(data))
        drain_all(ctx)
        assert ctx.redis.zcard(ctx.keys.active("dst")) == 2
        assert ctx.redis.zcard(ctx.keys.active("other")) == 0
        assert ctx.redis.xlen(ctx.keys.dead()) == 2
    finally:
        ctx.close()


def test_an_inbox_bound_below_the_batch_size_is_queued_in_parts(redis_db, tmp_path):
    """With ZQ_MAX_PENDING under --batch, the importer queues parts that fit and waits for the
    worker (a thread draining here) between them."""
    bounded = make_settings(tmp_path, max_pending=5)
    ctx = WorkerContext.build(bounded)
    done = threading.Event()

    def work() -> None:
        while not done.is_set():
            drain_all(ctx)
            done.wait(0.01)

    worker = threading.Thread(target=work)
    worker.start()
    try:
        lines = "".join(f"tide table entry {i}\n" for i in range(23)).encode()
        summary = import_stream(bounded, "ns", io.BytesIO(lines), batch=500)
    finally:
        done.set()
        worker.join()
    try:
        drain_all(ctx)
        assert summary.imported == ctx.redis.zcard(ctx.keys.active("ns")) == 23
    finally:
        ctx.close()


def test_cli_import_wait_returns_once_the_notes_are_organised(
    cli_env, ctx, server, capsys, tmp_path
):
    path = tmp_path / "diary.txt"
    path.write_text("Rain all morning.\nThe ferry was late.\n")
    assert main(["import", "diary", str(path), "--wait", "--timeout", "30"]) == 0
    assert json.loads(capsys.readouterr().out)["imported"] == 2
    assert ctx.redis.zcard(ctx.keys.active("diary")) == 2  # no drain here: --wait waited for it


def test_atomic_notes_and_their_source_round_trip_without_asking_the_model(
    redis_db, tmp_path, chat
):
    """An input split into atomic notes (ZQ_ATOMISE, the loopback chat server) comes back as
    the same source note, atoms, part_of metadata and links; restoring calls no model."""
    chat.reply_with(answer_with(describe))
    ctx = build(tmp_path, chat.url)
    try:
        with MemoryClient(ctx.settings) as mem:
            nid = mem.store(LONG, namespace="a", metadata={"m": 1})
        drain_all(ctx)
        import_stream(ctx.settings, "b", io.BytesIO(export_file(ctx.redis, ctx.keys, "a")))
        drain_all(ctx)
        before, after = exported(ctx.redis, ctx.keys, "a")[1], exported(ctx.redis, ctx.keys, "b")[1]
    finally:
        ctx.close()
    assert after == before and len(before) == 4
    assert before[nid]["kind"] == "source"
    atom = before[construction.atom_id(nid, 1)]
    assert atom["metadata"] == {"m": 1, "part_of": nid}
    assert any(link["target"] == nid and "part_of" in link["reason"] for link in atom["links"])
    assert len(chat.requests) == 1  # the source's construction; the restore asked nothing
