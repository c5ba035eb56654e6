from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from producer.keys import Keys

NAMESPACE_KEYS: list[Callable[[Keys, str], str]] = [
    lambda k, ns: k.note(ns, "n1"),
    lambda k, ns: k.links(ns, "n1"),
    Keys.active,
    Keys.seq,
    Keys.tombstoned,
    Keys.changes,
    Keys.version,
    Keys.touches,
    Keys.audit,
    Keys.stats,
    Keys.lock,
    lambda k, ns: k.proposal(ns, "p1"),
    lambda k, ns: k.proposals(ns, "pending"),
    Keys.proposed,
    Keys.evolved,
    Keys.refused,
    Keys.judge,
]
SHARD_KEYS: list[Callable[[Keys, int], str]] = [
    Keys.inbox,
    Keys.lease,
    Keys.kicked,
    Keys.drainer,
    Keys.shard_search,
]
GLOBAL_KEYS: list[Callable[[Keys], str]] = [
    Keys.search_queue,
    lambda k: k.reply("job1"),
    Keys.dead,
    Keys.namespaces,
    lambda k: k.searcher("host-1-ab12cd"),
    lambda k: k.process("host-1-ab12cd"),
    Keys.processes,
    lambda k: k.vcache("hash-v1-d256", "ab" * 32),
    lambda k: k.token("0123456789abcdef"),
    Keys.tokens,
    Keys.tokens_changed,
]


def hash_tag(key: str) -> str:
    """The part of a key Redis Cluster hashes: the first non-empty {...}."""
    start = key.index("{")
    end = key.index("}", start + 1)
    return key[start + 1 : end]


@pytest.mark.parametrize("make", NAMESPACE_KEYS)
@pytest.mark.parametrize("ns", ["default", "agents/alice", "team.b:notes"])
def test_every_namespace_key_carries_the_namespace_hash_tag(
    make: Callable[[Keys, str], str], ns: str
) -> None:
    key = make(Keys("zq"), ns)

    assert key.startswith("zq:{" + ns + "}:")
    assert hash_tag(key) == ns


def test_the_keys_of_one_namespace_are_all_distinct() -> None:
    keys = [make(Keys(), "ns") for make in NAMESPACE_KEYS]

    assert len(set(keys)) == len(keys)


def test_note_and_links_keys_end_with_the_note_id() -> None:
    k = Keys()

    assert k.note("ns", "abc") == "zq:{ns}:note:abc"
    assert k.links("ns", "abc") == "zq:{ns}:links:abc"


@pytest.mark.parametrize("make", SHARD_KEYS)
@pytest.mark.parametrize("shard", [0, 3, 7])
def test_every_shard_key_carries_the_shard_hash_tag(
    make: Callable[[Keys, int], str], shard: int
) -> None:
    key = make(Keys("zq"), shard)

    assert key.startswith("zq:{s" + str(shard) + "}:")
    assert hash_tag(key) == f"s{shard}"


def test_shard_keys_of_different_shards_differ() -> None:
    k = Keys()

    assert len({k.inbox(s) for s in range(8)}) == 8


@pytest.mark.parametrize("make", GLOBAL_KEYS)
def test_global_keys_have_no_hash_tag(make: Callable[[Keys], str]) -> None:
    key = make(Keys("zq"))

    assert key.startswith("zq:")
    assert "{" not in key and "}" not in key


def test_the_reply_key_names_the_job() -> None:
    assert Keys("zq").reply("0123abcd") == "zq:reply:0123abcd"


@pytest.mark.parametrize(
    ("namespace", "shards", "expected"),
    [
        ("default", 8, 7),
        ("agents/alice", 8, 4),
        ("team.b:notes", 8, 1),
        ("default", 1024, 223),
        ("agents/alice", 1024, 468),
        ("team.b:notes", 1024, 977),
    ],
)
def test_shard_of_is_stable_across_processes_and_versions(
    namespace: str, shards: int, expected: int
) -> None:
    # Producers and workers on different hosts must agree, so the value is pinned here (crc32).
    assert Keys("zq", shards).shard_of(namespace) == expected


def test_shard_of_does_not_depend_on_the_prefix() -> None:
    assert Keys("zq", 8).shard_of("default") == Keys("other", 8).shard_of("default")


@given(st.text(min_size=1, max_size=64), st.integers(min_value=1, max_value=1024))
def test_shard_of_is_within_range_and_repeatable(namespace: str, shards: int) -> None:
    keys = Keys("zq", shards)

    shard = keys.shard_of(namespace)

    assert 0 <= shard < shards
    assert keys.shard_of(namespace) == shard


def test_shard_of_spreads_namespaces_over_every_shard() -> None:
    keys = Keys("zq", 8)

    assert {keys.shard_of(f"ns{i}") for i in range(200)} == set(range(8))


def all_keys(k: Keys) -> set[str]:
    return (
        {make(k, "ns") for make in NAMESPACE_KEYS}
        | {make(k, s) for make in SHARD_KEYS for s in range(k.shard_count)}
        | {make(k) for make in GLOBAL_KEYS}
    )


def test_two_prefixes_share_no_key() -> None:
    a, b = Keys("zq"), Keys("zq2")

    assert not all_keys(a) & all_keys(b)
    assert all(key.startswith("zq:") for key in all_keys(a))
    assert all(key.startswith("zq2:") for key in all_keys(b))


def test_the_default_prefix_is_zq() -> None:
    assert Keys().prefix == "zq"
    assert Keys().search_queue() == "zq:search"


def test_one_namespace_searches_on_its_shard_list_several_on_the_shared_one() -> None:
    keys = Keys("zq", 8)

    assert keys.search_queue_of(["acme"]) == keys.shard_search(keys.shard_of("acme"))
    assert keys.search_queue_of(["acme", "globex"]) == "zq:search"
