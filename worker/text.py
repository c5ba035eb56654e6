"""How text becomes words (no model): tokens, ranked keywords, derived tags and the lead sentence
that is a note's one-line context."""

from __future__ import annotations

import re
from collections import Counter

QUOTES = "'\u2019-"  #: stripped from both ends of a word
POSSESSIVES = ("'s", "\u2019s")  #: "customer's" -> "customer"
WORD_RE = re.compile(r"[^\W_][\w'\u2019-]*", re.UNICODE)  #: a word: letters/digits, inner ' and -
QUOTE_RE = re.compile(f"[{re.escape(QUOTES)}]")  #: a character ``tokenize`` may strip
#: Longest keyword, as ZQ_MAX_TAG_CHARS's default: a longer "word" is a token, hash or blob,
#: not a subject, and would become a tag longer than a caller may give.
MAX_KEYWORD_CHARS = 64
LEAD_MAX_CHARS = 200  #: longest lead sentence (a note's context line)
SENTENCE_END = re.compile(r"(?<=[.!?])\s+")  #: where a sentence ends

#: Common English words that never make a keyword.
STOPWORDS = frozenset(
    """a about above after again against all also am an and any are as at be because been before
    being below between both but by can could did do does doing down during each even ever few for
    from further get gets got had has have having he her here hers herself him himself his how i if
    in into is it its itself just let like me more most much must my myself no nor not now of off
    on once only or other our ours ourselves out over own really same say says she should so some
    still such than that the their theirs them themselves then there these they this those through
    to too under until up us very was we well were what when where which while who whom why will
    with would yeah yes you your yours yourself yourselves i'm it's that's don't i've you're
    thanks thank oh hey hi wow sure okay ok lot lots one things thing way going really""".split()
)


def tokenize(text: str) -> list[str]:
    """Lowercased words with leading/trailing quote marks and hyphens stripped.

    A word starts with a letter or digit (WORD_RE), so only its end can hold a possessive or
    quote marks, and stripping never empties it; a text without any of those characters is
    its words as found."""
    words = WORD_RE.findall(text.lower())
    if QUOTE_RE.search(text) is None:
        return words
    return [(w[:-2] if w.endswith(POSSESSIVES) else w).rstrip(QUOTES) for w in words]


def extract_keywords(text: str, max_keywords: int = 8) -> list[str]:
    """The most salient content words: frequency, then length, then first position."""
    return keywords_of(tokenize(text), max_keywords)


def keywords_of(tokens: list[str], max_keywords: int = 8) -> list[str]:
    """``extract_keywords`` of a text that ``tokenize`` already split."""
    words = [w for w in tokens if is_keyword(w)]
    if not words:
        return []
    counts = Counter(words)  # in first-position order, which the stable sort keeps for ties
    ranked = sorted(counts, key=lambda w: (-counts[w], -min(len(w), 12)))
    return ranked[:max_keywords]


def is_keyword(word: str) -> bool:
    """Whether a tokenized word may be a keyword: no stop word, no number, 3 to
    MAX_KEYWORD_CHARS characters."""
    return word not in STOPWORDS and 2 < len(word) <= MAX_KEYWORD_CHARS and not word.isdigit()


def derive_tags(
    keywords: list[str],
    caller_tags: list[str],
    max_tags: int = 8,
    max_chars: int = MAX_KEYWORD_CHARS,
) -> list[str]:
    """Caller tags first, then the top keywords of at most ``max_chars`` characters (the
    producer's ZQ_MAX_TAG_CHARS), without duplicates."""
    out = list(dict.fromkeys(caller_tags))
    for kw in keywords:
        if len(out) >= max(max_tags, len(caller_tags)):
            break
        if kw not in out and len(kw) <= max_chars:
            out.append(kw)
    return out


def lead_sentence(content: str, max_chars: int = LEAD_MAX_CHARS) -> str:
    """The content's first sentence, whitespace collapsed, cut at a word within ``max_chars``
    (with an ellipsis when cut)."""
    text = " ".join(content.split())
    sentence = SENTENCE_END.split(text, maxsplit=1)[0]
    if len(sentence) <= max_chars:
        return sentence
    cut = sentence[: max_chars - 1]
    head = cut.rsplit(" ", 1)[0] if " " in cut else cut
    return head.rstrip(" ,;:-") + "\u2026"
