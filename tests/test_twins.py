"""The twins table of docs/ARCHITECTURE.md ("The twins") against the tree.

A twin is a fact computed in more than one place (the forward pass in C and in numpy, the
sampler, the image format, ...). The table lists, per fact, the file that defines it, the
files that mirror it and the tests that hold them equal. It stays true because:
  - every file it names exists;
  - every mirror it lists names, in its opening comment or docstring, a file of its row
    (so a mirror says what it mirrors);
  - every source file whose opening comment or docstring says it mirrors or twins another
    file of this repository is in the table.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "ARCHITECTURE.md"
SOURCES = ("native", "tools", "firmware")
SUFFIXES = (".c", ".h", ".py")
TWIN_WORD = re.compile(r"\b(mirror|mirrors|mirrored|twin|twins)\b", re.IGNORECASE)
PATH_WORD = re.compile(r"[\w./-]+\.(?:c|h|py)\b")


@dataclass
class Row:
    fact: str
    defined: list[str]
    mirrors: list[str]
    tests: list[str]


def table(markdown: str) -> list[Row]:
    """The rows of the "The twins" section's table."""
    if "## The twins" not in markdown:
        return []
    section = markdown.split("## The twins", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("|") or len(cells) != 4 or cells[0] in ("fact", "---"):
            continue
        files = [re.findall(r"`([^`]+)`", c) for c in cells[1:]]
        rows.append(Row(cells[0], *files))
    return rows


def opening(path: str, text: str) -> str:
    """A source file's opening comment (C) or module docstring (Python)."""
    if path.endswith(".py"):
        try:
            return ast.get_docstring(ast.parse(text)) or ""
        except SyntaxError:
            return ""
    m = re.match(r"\s*/\*(.*?)\*/", text, re.DOTALL)
    return m.group(1) if m else ""


def named(path: str, head: str, files: set[str]) -> set[str]:
    """The repository source files (tests aside) that `head` names: by path, by
    a name in the same folder, or by a name only one file has."""
    out = set()
    folder = PurePosixPath(path).parent
    for word in PATH_WORD.findall(head):
        candidates = [word, str(folder / word)]
        if "/" not in word:
            alike = [f for f in files if PurePosixPath(f).name == word]
            candidates += alike if len(alike) == 1 else []
        out.update(c for c in candidates if c in files and not c.startswith("tests/"))
    return out


def problems(files: dict[str, str], markdown: str) -> list[str]:
    """What is wrong between the table and `files` (repository path -> text)."""
    rows = table(markdown)
    found = [] if rows else ["docs/ARCHITECTURE.md has no twins table"]
    in_table: set[str] = set()
    for row in rows:
        for path in row.defined + row.mirrors + row.tests:
            if path not in files:
                found.append(f"{path}: listed for '{row.fact}', but there is no such file")
        in_table.update(row.defined, row.mirrors)
        for mirror in row.mirrors:
            if mirror not in files:
                continue
            others = set(row.defined + row.mirrors) - {mirror}
            if not named(mirror, opening(mirror, files[mirror]), set(files)) & others:
                found.append(f"{mirror}: mirrors '{row.fact}', but its opening comment names "
                             f"none of {', '.join(sorted(others))}")
    for path, text in sorted(files.items()):
        head = opening(path, text)
        if (path not in in_table and path.startswith(SOURCES) and TWIN_WORD.search(head)
                and named(path, head, set(files))):
            found.append(f"{path}: says it mirrors or twins "
                         f"{', '.join(sorted(named(path, head, set(files))))}, but is not in "
                         f"the twins table of docs/ARCHITECTURE.md")
    return found


def tree() -> dict[str, str]:
    """Every source file under native/, tools/ and firmware/, and the tests."""
    out = {}
    for top in (*SOURCES, "tests"):
        for p in (ROOT / top).rglob("*"):
            if p.suffix in SUFFIXES and p.is_file() and "__pycache__" not in p.parts:
                out[p.relative_to(ROOT).as_posix()] = p.read_text(errors="replace")
    return out


def test_the_twins_table_matches_the_tree() -> None:
    assert problems(tree(), DOC.read_text()) == []


def test_every_row_names_a_definition_a_mirror_and_a_test() -> None:
    rows = table(DOC.read_text())
    assert len(rows) >= 8
    for row in rows:
        assert row.defined and row.mirrors and row.tests, row


def test_a_listed_file_that_disappears_is_found() -> None:
    files = tree()
    del files["tools/mpllm/formats/drafts_table.py"]
    assert any(p.startswith("tools/mpllm/formats/drafts_table.py: listed for 'n-gram drafter'")
               for p in problems(files, DOC.read_text()))


def test_an_unlisted_mirror_is_found() -> None:
    files = tree()
    files["tools/mpllm/reference/fast_forward.py"] = (
        '"""A faster numpy mirror of native/engine/engine.c."""\n')
    found = problems(files, DOC.read_text())
    assert found == [("tools/mpllm/reference/fast_forward.py: says it mirrors or twins "
                      "native/engine/engine.c, but is not in the twins table of "
                      "docs/ARCHITECTURE.md")]


def test_a_mirror_that_stops_naming_its_twin_is_found() -> None:
    files = tree()
    files["tools/mpllm/reference/sampler.py"] = '"""The sampler, bit for bit."""\n'
    found = problems(files, DOC.read_text())
    assert len(found) == 1 and found[0].startswith(
        "tools/mpllm/reference/sampler.py: mirrors 'sampler'")
