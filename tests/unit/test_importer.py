"""The pure parts of ``zettelq import``: format detection, content ids and the mem0 mapping."""

from __future__ import annotations

import pytest

from worker.transfer.importer import ImportLineError, content_id, detect, mem0_item


@pytest.mark.parametrize(
    ("first", "fmt"),
    [
        (b'{"zettelq_export": 1, "namespace": "a"}\n', "zettelq"),
        (b'{"content": "hello", "tags": ["x"]}\n', "jsonl"),
        (b'{"results": [{"id": "1", "memory": "m"}]}\n', "mem0"),
        (b"{\n", "mem0"),  # a pretty-printed JSON document
        (b"[\n", "mem0"),
        (b"Ada wrote the first program.\n", "text"),
        (b'"just a quoted line"\n', "text"),
        (b"42\n", "text"),
    ],
)
def test_the_first_line_tells_the_format(first, fmt):
    assert detect(first) == fmt


def test_content_ids_are_stable_valid_ids_that_differ_by_content():
    assert content_id("a") == content_id("a") != content_id("b")
    assert len(content_id("a")) == 32 and int(content_id("a"), 16) >= 0


def test_a_mem0_memory_maps_to_store_fields():
    item = mem0_item(
        1,
        {
            "id": "m-1",
            "memory": "Prefers tea",
            "metadata": {"k": 1},
            "user_id": "u",
            "run_id": "r",
            "created_at": "2024-01-01T00:00:00Z",
            "score": 0.9,
        },
    )
    assert item == {
        "id": "m-1",
        "content": "Prefers tea",
        "metadata": {
            "k": 1,
            "mem0": {"user_id": "u", "run_id": "r", "created_at": "2024-01-01T00:00:00Z"},
        },
        "agent": "u",
        "event_time": "2024-01-01T00:00:00Z",
        "tags": None,
    }


def test_a_mem0_memory_without_text_names_its_entry():
    with pytest.raises(ImportLineError, match="entry 4: a mem0 memory is an object"):
        mem0_item(4, {"id": "x"})
    assert "id" not in mem0_item(1, {"id": "not valid!", "memory": "m"})
