"""The README and docs/ send readers only to files a clone has: every relative link
resolves to a file or folder inside the repository, and no path in backticks climbs out of
it (a `../shared/...` that only the developers' machine had)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LINK = re.compile(r"\]\(([^)\s]+)\)")
CODE = re.compile(r"`([^`\n]+)`")


def documents() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def outside_links(doc: Path, text: str) -> list[str]:
    """What in `text` (the Markdown of `doc`) points outside the repository or at
    nothing."""
    found = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue  # a web address or a place in this page
        path = (doc.parent / target.split("#", 1)[0]).resolve()
        if not path.is_relative_to(ROOT) or not path.exists():
            found.append(target)
    for code in CODE.findall(text):
        for word in code.split():
            if word.startswith("../") and not (doc.parent / word).resolve().is_relative_to(ROOT):
                found.append(word)
    return found


def test_readme_and_docs_link_only_inside_the_repository() -> None:
    for doc in documents():
        assert outside_links(doc, doc.read_text()) == [], doc.name


def test_a_link_out_of_the_repository_is_found() -> None:
    readme = ROOT / "README.md"
    text = "Plans: `../shared/DESIGN.md`, [golden](../shared/golden), [gone](docs/NOPE.md)."
    assert outside_links(readme, text) == ["../shared/golden", "docs/NOPE.md",
                                           "../shared/DESIGN.md"]
    docs_page = ROOT / "docs" / "GLOSSARY.md"
    assert outside_links(docs_page, "[up](../README.md), `../tools/chat.py`") == []
