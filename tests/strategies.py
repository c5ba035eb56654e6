"""Hypothesis strategies for what callers pass to the client: valid values and everything
around them (wrong types, out-of-range numbers, lone surrogates, odd Unicode)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from hypothesis import strategies as st

texts = st.text(max_size=80) | st.text(st.characters(categories=["Cs"]), min_size=1, max_size=3)
good_names = st.from_regex(r"[A-Za-z0-9_.:@/-]{1,16}", fullmatch=True)
names = good_names | st.text(st.sampled_from("abAZ09_.:@/-{} \n\x00\u00e9"), max_size=12)
json_leaves = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(max_size=20)
    | st.binary(max_size=20)
)
json_values = st.recursive(
    json_leaves,
    lambda kids: (
        st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=6), kids, max_size=4)
    ),
    max_leaves=12,
)
metadatas = (
    st.none()
    | st.dictionaries(st.text(max_size=8), json_values, max_size=5)
    | st.dictionaries(st.integers(), st.integers(), min_size=1, max_size=2)
    | st.lists(st.integers(), max_size=2)
    | st.text(max_size=4)
)
offsets = st.timedeltas(min_value=timedelta(hours=-23), max_value=timedelta(hours=23)).map(timezone)
datetimes = st.datetimes(timezones=st.none() | offsets)
times = (
    st.none()
    | st.integers(-(10**11), 10**11)
    | st.integers()
    | st.floats()
    | st.booleans()
    | datetimes
    | datetimes.map(datetime.isoformat)
    | st.text(max_size=12)
)
anything = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10)
tag_lists = (
    st.none()
    | st.lists(st.text(max_size=10) | st.integers() | st.none(), max_size=5)
    | st.text(max_size=5)
    | st.binary(max_size=3)
    | st.integers()
)
store_fields = st.fixed_dictionaries(
    {},
    optional={
        "id": st.none() | names | st.integers(),
        "agent": st.none() | texts | st.integers(),
        "metadata": metadatas,
        "tags": tag_lists,
        "event_time": times,
        "importance": st.floats(0, 1)
        | st.floats()
        | st.integers()
        | st.booleans()
        | st.text(max_size=3),
    },
)

# values the client accepts, at and near its limits: what every read path must then render
valid_leaves = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)
valid_metadatas = st.dictionaries(
    st.text(max_size=8),
    st.recursive(
        valid_leaves,
        lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=6), kids),
        max_leaves=10,
    ),
    max_size=5,
)
valid_times = (
    st.floats(-6.2e10, 1e11)
    | st.datetimes(datetime(1, 1, 3), datetime(5000, 1, 1), timezones=st.none() | offsets)
    | st.datetimes(max_value=datetime(5000, 1, 1)).map(datetime.isoformat)
)
accepted_texts = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"))
accepted_store_fields = st.fixed_dictionaries(
    {},
    optional={
        "agent": accepted_texts.filter(lambda t: t.strip()).map(lambda t: t[:128]),
        "metadata": valid_metadatas,
        "tags": st.lists(accepted_texts.filter(str.strip).map(lambda t: t[:32]), max_size=8),
        "event_time": valid_times,
        "importance": st.floats(0, 1),
    },
)
