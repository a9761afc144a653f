"""The README and docs/ send readers only to files a clone has: every relative link
resolves to a file or folder inside the repository, a link's #place to a heading of the page
it names, and no path in backticks climbs out of it (a `../shared/...` that only the
developers' machine had)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LINK = re.compile(r"\]\(([^)\s]+)\)")
CODE = re.compile(r"`([^`\n]+)`")
HEADING = re.compile(r"^#{1,6} +(.+?) *#*$", re.MULTILINE)
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)


def anchors(markdown: str) -> set[str]:
    """The #places of a page's headings as GitHub makes them: lower case, punctuation
    dropped, spaces to hyphens (a heading repeated gets -1, -2, ...)."""
    seen: dict[str, int] = {}
    out = set()
    for title in HEADING.findall(FENCE.sub("", markdown)):
        slug = re.sub(r"[^\w\- ]", "", title.replace("`", "").lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def documents() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def outside_links(doc: Path, text: str) -> list[str]:
    """What in `text` (the Markdown of `doc`) points outside the repository or at
    nothing."""
    found = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):
            continue  # a web address
        name, _, place = target.partition("#")
        path = (doc.parent / name).resolve() if name else doc
        if not path.is_relative_to(ROOT) or not path.exists():
            found.append(target)
            continue
        if place and (path.suffix != ".md"
                      or place not in anchors(text if path == doc else path.read_text())):
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


def test_a_place_no_heading_has_is_found() -> None:
    readme = ROOT / "README.md"
    text = ("# Top\n## Try it (two commands)\n## Try it (two commands)\n"
            "[a](#try-it-two-commands) [b](#try-it-two-commands-1) [c](#nowhere) "
            "[d](docs/using.md#the-chat) [e](docs/using.md#no-such-place)")
    assert outside_links(readme, text) == ["#nowhere", "docs/using.md#no-such-place"]
