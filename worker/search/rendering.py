"""The text ``context()`` returns: the best hits within a token budget, each fenced as quoted
data (id, namespace, date) so that stored text cannot pose as instructions (the blocks are
producer/rendering.py's, which the doors use too)."""

from __future__ import annotations

from producer.protocol import Hit
from producer.rendering import CONTEXT_HEADER, hit_block

CHARS_PER_TOKEN = 4  #: rough token estimate for context()


def render_context(hits: list[Hit], max_tokens: int) -> str:
    """Best hits first, each fenced as stored data, within ``max_tokens`` (about 4 chars each)."""
    budget = max_tokens * CHARS_PER_TOKEN - len(CONTEXT_HEADER)
    blocks: list[str] = []
    for h in hits:
        block = hit_block(h)
        if len(block) + 1 > budget:
            break
        blocks.append(block)
        budget -= len(block) + 1
    return "\n".join([CONTEXT_HEADER, *blocks]) if blocks else ""
