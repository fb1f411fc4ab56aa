"""The README and docs/ stay usable: the README is a front page (short, with contents and
a production checklist near the top), and every link between the documents lands on a
file and a heading that exist (tests/e2e/test_docs.py runs the curl walk-through)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.topology import REPO

README = REPO / "README.md"
DOCS = sorted((REPO / "docs").glob("*.md"))
DOCUMENTS = [README, REPO / "BENCHMARKS.md", *DOCS]
#: a Markdown link: its text and its target
LINK = re.compile(r"\[([^\]]*)\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~)")


# -- reading Markdown -----------------------------------------------------------------------------


def prose(text: str) -> Iterator[str]:
    """The lines of ``text`` outside fenced code blocks, inline code spans removed."""
    fenced = False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            yield re.sub(r"`[^`]*`", "", line)


def headings(text: str) -> list[str]:
    fenced = False
    found = []
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced and (match := re.match(r"#{1,6} (.+)", line)):
            found.append(match.group(1).strip())
    return found


def anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to
    hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    for heading in headings(path.read_text()):
        base = anchor(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(path: Path) -> list[tuple[str, str]]:
    return [
        (match.group(1), match.group(2))
        for line in prose(path.read_text())
        for match in LINK.finditer(line)
    ]


# -- the documents --------------------------------------------------------------------------------


def test_there_is_reference_documentation() -> None:
    names = {path.name for path in DOCS}
    assert {"configuration.md", "routing.md", "operations.md", "security.md"} <= names


@pytest.mark.parametrize("path", DOCUMENTS, ids=lambda p: p.name)
def test_every_link_lands_on_a_file_and_a_heading_that_exist(path: Path) -> None:
    checked = 0
    for text, target in links(path):
        if re.match(r"[a-z]+:", target):
            continue  # https://, mailto: ...
        file, _, fragment = target.partition("#")
        landing = (path.parent / file).resolve() if file else path
        assert landing.exists(), f"{path.name}: [{text}]({target}): no {landing}"
        if fragment:
            assert landing.suffix == ".md", f"{path.name}: [{text}]({target})"
            assert fragment in anchors(landing), f"{path.name}: [{text}]({target}): no such heading"
        checked += 1
    assert checked or path.name == "BENCHMARKS.md"


def test_the_readme_is_a_front_page() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) < 500, "the long reference belongs in docs/"
    sections = [line for line in lines if line.startswith("## ")]
    assert sections[:3] == ["## Contents", "## Quick start", "## Production checklist"]
    # the checklist within the first screens, each of its rows linking into docs/
    start = lines.index("## Production checklist")
    assert start < 80, start
    table = lines[next(i for i in range(start, len(lines)) if lines[i].startswith("|")) :]
    rows = table[2 : table.index("")]
    for topic in ("auth", "TLS", "failover", "drain", "limits", "workers", "alert"):
        row = next((row for row in rows if topic in row.split("|")[1]), None)
        assert row is not None, f"the checklist has no {topic} row"
        assert re.search(r"\]\(docs/\w+\.md#[\w-]+\)", row), row
    for command in ("make demo", "make test"):
        assert [line for line in lines[:60] if line.startswith(f"    {command} ")], command
