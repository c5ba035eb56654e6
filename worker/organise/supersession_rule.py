"""The supersession rule (pure): does a newer note explicitly change what an older one states?

It reads an explicit change in the newer note (``change_of``) — "switch(ed) [the S] (from X) to
Y", "moved/migrated/changed [S] from X to Y", "replaced X with Y", "X was replaced by Y", "use Y
instead of X", "S now uses Y", "no longer use X" — and what the older note states
(``statements_of``) — "chose/use/picked V for S", "S uses / is built with / is written in /
runs on / must be / is V" — and fires (``judge_pair``) when a statement has the change's subject
S or old value X and a value other than Y. Values must look like names (capitalised, or with a
digit or one of ``.+#``).

It does not fire when each note names (capitalised words) something the other never mentions,
on a hedged, asked, planned, conditional or negated change ("might", "should", "plan", "if",
"not", a question mark, ...), on an older note that already mentions Y, on a change with
neither subject nor old value, or on a plain contradiction without a change marker: those are
the LLM judge's (worker.organise.supersession).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from worker.index.lexical import analyze
from worker.organise.pairs import Text
from worker.text import STOPWORDS

_DET = r"(?:(?:the|our|its|their|this|a|an)\s+)?"
_WORD = r"(?!(?:from|to|with|by|of|instead)\b)[a-z][\w-]*"  #: a subject word
_SUBJECT = _DET + rf"(?P<subject>{_WORD}(?:\s+{_WORD}){{0,2}}?)"
_OLD = _DET + r"(?P<old>[a-z0-9][\w.+#-]*)"
_NEW = _DET + r"(?P<new>[a-z0-9][\w.+#-]*)"
_VALUE = _DET + r"(?P<value>[a-z0-9][\w.+#-]*)"
_CHANGE_VERB = r"(?:switch|mov|migrat|chang|port|convert|transition|upgrad)\w*"
_CHOICE_VERB = (
    r"(?:chose|choose|chosen|picked|pick|selected|select|adopted|adopt|use|uses|used|using"
    r"|went with|go with|settled on|opted for|standardi[sz]ed on|switched to|moved to"
    r"|migrated to)"
)
_STATE_VERB = (
    r"(?:uses|used|is using|runs on|ran on|is built with|was built with|is built on"
    r"|is written in|was written in|is implemented in|is based on|must be|will be|is now"
    r"|was|is|are)"
)
#: Any explicit change contains one of these (cheap substring tests before the patterns).
VERB_STEMS = ("switch", " mov", "migrat", "chang", " port", "convert", "transition", "upgrad")
TRIGGERS = (*VERB_STEMS, "replac", "instead", " now ", "longer")
#: Explicit changes in a newer note (each names the new value, the old one, or both), each
#: with the words of which the text must contain one before the (slower) pattern is tried.
CHANGES = tuple(
    (gate, re.compile(p, re.IGNORECASE))
    for gate, p in (
        (("from",), rf"\b{_CHANGE_VERB}\s+(?:{_SUBJECT}\s+)?from\s+{_OLD}\s+to\s+{_NEW}"),
        (("replac",), rf"\breplac(?:e|es|ed|ing)\s+{_OLD}\s+(?:with|by)\s+{_NEW}"),
        (
            ("replaced",),
            rf"\b{_OLD}\s+(?:was|is|has been|have been|is being|got)\s+replaced\s+(?:with|by)"
            rf"\s+{_NEW}",
        ),
        (
            ("instead",),
            rf"\b(?:use|uses|using|chose|choose|picked|went with|go with|adopted)\s+{_NEW}"
            rf"\s+instead\s+of\s+{_OLD}",
        ),
        (VERB_STEMS, rf"\b{_CHANGE_VERB}\s+(?:{_SUBJECT}\s+)?(?:over\s+)?to\s+{_NEW}"),
        (
            (" now ",),
            rf"\b{_SUBJECT}\s+now\s+(?:uses|runs on|is built with|is written in|is)\s+{_NEW}",
        ),
        (("longer",), rf"\bno\s+longer\s+(?:use|uses|using|run|runs|rely on|relies on)\s+{_OLD}"),
    )
)
#: What an older note states: a value for a subject.
STATEMENTS = tuple(
    re.compile(p, re.IGNORECASE)
    for p in (
        rf"\b{_CHOICE_VERB}\s+{_VALUE}\s+(?:for|as)\s+{_SUBJECT}\b",
        rf"\b{_SUBJECT}\s+{_STATE_VERB}\s+{_VALUE}",
    )
)
#: A change that is asked, hedged, planned, conditional or negated is no change yet: these
#: words, words starting with HEDGE_PREFIXES, or a question mark.
HEDGE_WORDS = frozenset(
    """might may maybe perhaps could should would if whether unless not never won't don't
    didn't doesn't isn't aren't wasn't cannot can't against""".split()
)
#: A capitalised word: a name unless it is a stop word ("We", "The").
NAMES = re.compile(r"\b[A-Z][\w+#-]*")
HEDGE_PREFIXES = ("consider", "think", "plan", "propos", "suggest", "evaluat", "discuss")
WORDS = re.compile(r"[a-z']+")


def hedged(lowered: str) -> bool:
    """Whether a lowercased text asks, hedges, plans, conditions or negates."""
    if "?" in lowered:
        return True
    return any(w in HEDGE_WORDS or w.startswith(HEDGE_PREFIXES) for w in WORDS.findall(lowered))


@dataclass(frozen=True)
class Change:
    """An explicit change a newer note states: subject S, old value X, new value Y (each may
    be unknown, but S or X is known)."""

    subject: str | None
    old: str | None
    new: str | None


def _value(raw: str | None) -> str | None:
    """A captured value, if it looks like a name: capitalised, or with a digit or ``.+#``."""
    if raw is None:
        return None
    value = raw.rstrip(".-")
    named = value[:1].isupper() or any(ch.isdigit() or ch in ".+#" for ch in value)
    return value.lower() if value and named else None


def _subject(raw: str | None) -> str | None:
    """A captured subject as its stemmed content words, or None."""
    words = analyze(raw) if raw else []
    return " ".join(words) if words else None


def change_of(content: str) -> list[Change]:
    """The explicit changes ``content`` states (none when it is hedged, asked or negated)."""
    lowered = " " + content.lower()  # so a stem with a leading space matches a first word
    if not any(t in lowered for t in TRIGGERS) or hedged(lowered):
        return []
    out: list[Change] = []
    for gate, pattern in CHANGES:
        if not any(word in lowered for word in gate):
            continue
        for m in pattern.finditer(content):
            groups = m.groupdict()
            old, new = _value(groups.get("old")), _value(groups.get("new"))
            if ("old" in groups and old is None) or ("new" in groups and new is None):
                continue
            change = Change(_subject(groups.get("subject")), old, new)
            if change.subject is not None or change.old is not None:
                out.append(change)
    return out


def statements_of(content: str) -> list[tuple[str, str]]:
    """(subject, value) pairs an older note states, values that look like names only."""
    out: list[tuple[str, str]] = []
    for pattern in STATEMENTS:
        for m in pattern.finditer(content):
            subject, value = _subject(m.group("subject")), _value(m.group("value"))
            if subject is not None and value is not None:
                out.append((subject, value))
    return out


def _mentions(content: str, value: str) -> bool:
    return re.search(rf"(?<!\w){re.escape(value)}(?!\w)", content.lower()) is not None


def _same_subject(a: str, b: str) -> bool:
    left, right = set(a.split()), set(b.split())
    return bool(left and right) and (left <= right or right <= left)


def names_of(content: str) -> set[str]:
    """Capitalised words other than stop words (projects, people, products), lowercased."""
    return {w.lower() for w in NAMES.findall(content)} - STOPWORDS


def judge_pair(new: Text, old: Text) -> str | None:
    """The rule: the evidence that ``new`` supersedes ``old``, or None. Two notes that each name
    something the other never mentions (other projects, other people) are about different
    things."""
    if not eligible(new, old):
        return None
    for change in change_of(new.content):
        if change.new is not None and _mentions(old.content, change.new):
            continue
        for subject, value in statements_of(old.content):
            if change.subject is not None and not _same_subject(change.subject, subject):
                continue
            if change.old is not None and value != change.old:
                continue
            values = {value, change.old, change.new}
            foreign_new = [
                n for n in names_of(new.content) - values if not _mentions(old.content, n)
            ]
            foreign_old = [
                n for n in names_of(old.content) - values if not _mentions(new.content, n)
            ]
            if foreign_new and foreign_old:
                continue
            return f"{subject}: {value} -> {change.new or '(none)'}"
    return None


def eligible(new: Text, old: Text) -> bool:
    """Both active plain notes, the older one still valid and older than the newer one."""
    return (
        new.id != old.id
        and new.active
        and old.active
        and new.kind == "note"
        and old.kind == "note"
        and new.valid_to is None
        and old.valid_to is None
        and (old.at, old.created_at) < (new.at, new.created_at)
    )
