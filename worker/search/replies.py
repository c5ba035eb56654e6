"""A search reply packed from parts its hits keep: a hit's fields besides its numbers (content,
links and labels, keywords, ...: most of a reply's bytes) are packed once, when the hit is first
sent, and a hit copied from it for a later search (``candidates.to_hits``) keeps those bytes, so
that reply packs only its hits' numbers. Decoded, the bytes are ``pack(reply)``'s."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgpack
from pydantic import PrivateAttr

from producer.errors import ProtocolError
from producer.protocol import Hit, Reply, pack

#: the fields of a hit that each search sets (``candidates.numbers``)
NUMBERS = (
    "score",
    "relevance",
    "similarity",
    "lexical",
    "importance",
    "recency",
    "connection_boost",
    "hop",
)
_NUMBER_SET = frozenset(NUMBERS)


class PackedHit(Hit):
    """A ``Hit`` that keeps its other fields as packed once (msgpack map entries, no header):
    its copies made with new numbers keep them; a copy that changes another field does not."""

    _rest: bytes | None = PrivateAttr(default=None)

    def model_copy(
        self, *, update: Mapping[str, Any] | None = None, deep: bool = False
    ) -> PackedHit:
        copy = super().model_copy(update=update, deep=deep)
        if update and not _NUMBER_SET.issuperset(update):
            copy._rest = None
        return copy

    def packed(self, packer: msgpack.Packer) -> bytes:
        """The hit as one msgpack map: its numbers, then its other fields as packed once."""
        fields, private = vars(self), self.__pydantic_private__  # not __getattr__: 1.4 us a read
        assert private is not None
        rest: bytes | None = private["_rest"]
        if rest is None:
            others = {name: value for name, value in fields.items() if name not in _NUMBER_SET}
            rest = b"".join(packer.pack(name) + packer.pack(v) for name, v in others.items())
            private["_rest"] = rest
        numbers: bytes = packer.pack({name: fields[name] for name in NUMBERS})
        header: bytes = packer.pack_map_header(len(fields))
        # a map of fewer than 16 entries has a one-byte header: the entries follow it
        return header + numbers[1:] + rest


def pack_reply(reply: Reply) -> bytes:
    """``pack(reply)``, its hits packed from the parts they keep when all are ``PackedHit``s
    (as a search's are); ProtocolError when a value cannot be packed."""
    hits = [h for h in reply.hits if isinstance(h, PackedHit)]
    if not hits or reply.runs or len(hits) < len(reply.hits):
        return pack(reply)
    packer = msgpack.Packer(use_bin_type=True)
    fields = vars(reply)
    try:
        parts = [packer.pack_map_header(len(fields))]
        for name, value in fields.items():
            parts.append(packer.pack(name))
            if name == "hits":
                parts.append(packer.pack_array_header(len(hits)))
                parts.extend(h.packed(packer) for h in hits)
            else:
                parts.append(packer.pack(value))
    except (TypeError, ValueError, OverflowError) as exc:
        raise ProtocolError(f"cannot pack Reply: {exc}") from exc
    return b"".join(parts)
