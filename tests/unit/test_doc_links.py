"""Every relative link in the README, CHANGELOG and docs/ points at a file that exists, and every
#anchor at a heading of that file (GitHub's heading ids)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def heading_ids(page: Path) -> set[str]:
    """The ids GitHub gives a page's headings: lowercase, punctuation dropped, spaces to '-'."""
    ids: set[str] = set()
    for line in FENCE.sub("", page.read_text()).splitlines():
        m = re.match(r"#{1,6} (.+)", line)
        if m:
            base = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
            slug, n = base, 0
            while slug in ids:
                n += 1
                slug = f"{base}-{n}"
            ids.add(slug)
    return ids


def relative_links(page: Path) -> list[str]:
    text = FENCE.sub("", page.read_text())
    return [t for t in LINK.findall(text) if not re.match(r"[a-z]+:", t)]


def test_heading_ids_follow_github() -> None:
    page = ROOT / "README.md"
    assert "when-to-use-it-and-when-not" in heading_ids(page)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    broken = []
    for target in relative_links(page):
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(target)
        elif anchor and dest.suffix == ".md" and anchor not in heading_ids(dest):
            broken.append(target)
    assert not broken, f"{page.name}: broken links {broken}"
