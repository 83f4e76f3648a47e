"""Every citation of the architecture map names a section it has: code, docs and tests cite
``docs/architecture.md, "Section"``, and a section renamed or folded away must take its
citations with it (docs/architecture.md, "Decisions")."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAP = ROOT / "docs" / "architecture.md"
SOURCES = ("src", "tests", "docs", "benchmarks", "tools")
TOP_FILES = ("README.md", "CONTRIBUTING.md", "BENCHMARKS.md", "Makefile")

# A citation may wrap over a comment or docstring line break: those become one space.
_WRAP = re.compile(r"\s*\n\s*(?:#+|\*|//)?\s*")
_CITATION = re.compile(r"architecture\.md`{0,2}[,(]? ?\(?\"([^\"]+)\"")
_SECTION_NUMBER = re.compile(r"architecture\.md`{0,2},? section \d")


def _headings() -> list[str]:
    return [
        line.lstrip("#").strip().replace("`", "")
        for line in MAP.read_text(encoding="utf-8").splitlines()
        if line.startswith("#")
    ]


def _files() -> list[Path]:
    files = [ROOT / name for name in TOP_FILES if (ROOT / name).exists()]
    for folder in SOURCES:
        for path in sorted((ROOT / folder).rglob("*")):
            if path.suffix in {".py", ".md", ".toml", ".txt"} and path.is_file():
                files.append(path)
    return files


def _citations() -> list[tuple[str, str]]:
    found = []
    for path in _files():
        if path == Path(__file__):
            continue
        text = _WRAP.sub(" ", path.read_text(encoding="utf-8", errors="replace"))
        for match in _CITATION.finditer(text):
            found.append((str(path.relative_to(ROOT)), match.group(1)))
    return found


def test_the_map_is_cited_by_its_section_names() -> None:
    citations = _citations()
    assert len(citations) > 50  # the pattern still finds the citations
    headings = _headings()
    unknown = sorted(
        (where, name)
        for where, name in citations
        if not any(h.startswith(name.replace("`", "").rstrip(".")) for h in headings)
    )
    assert unknown == []


def test_no_citation_by_a_section_number() -> None:
    numbered = [
        str(path.relative_to(ROOT))
        for path in _files()
        if path != Path(__file__)
        and _SECTION_NUMBER.search(_WRAP.sub(" ", path.read_text("utf-8", errors="replace")))
    ]
    assert numbered == []


def test_the_map_stays_one_sitting_long() -> None:
    """The map is read in one sitting: detail goes to a decision record or a docs page."""
    assert len(MAP.read_text(encoding="utf-8").splitlines()) <= 500
