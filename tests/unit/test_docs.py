"""The documents stay readable: every relative link and anchor resolves, and each stays in size.

The README is an operator's document (under 20,000 bytes), each page of docs/ under 40,000 bytes,
and the changelog one line per change of at most 240 characters. Anchors follow GitHub's rule:
a heading lower-cased, its punctuation dropped, spaces turned into hyphens, repeats numbered.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
CHANGELOG = ROOT / "CHANGELOG.md"
PAGES = sorted((ROOT / "docs").glob("*.md"))
DOCUMENTS = [README, CHANGELOG, *PAGES]
README_MAX_BYTES = 20_000
PAGE_MAX_BYTES = 40_000
CHANGELOG_MAX_CHARS = 240

FENCE = re.compile(r"^(```|~~~)")
INLINE_CODE = re.compile(r"`[^`]*`")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")
EXTERNAL = ("http://", "https://", "mailto:")


def prose_lines(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, text) of the lines outside fenced code blocks."""
    fenced = False
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if FENCE.match(line.lstrip()):
            fenced = not fenced
        elif not fenced:
            yield number, line


def slug(heading: str) -> str:
    """GitHub's anchor: lower case, letters, digits, `-` and `_` kept, spaces turned into `-`."""
    text = INLINE_CODE.sub(lambda code: code.group(0)[1:-1], heading).lower()
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link in a heading keeps its text
    return "".join(c for c in text if c.isalnum() or c in " -_").replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every anchor the headings of `path` define, repeats numbered as GitHub numbers them."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    for _, line in prose_lines(path):
        heading = HEADING.match(line)
        if heading:
            base = slug(heading.group(1))
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
    return found


def relative_links(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, target) of every link in `path` that is not an outside address."""
    for number, line in prose_lines(path):
        for match in LINK.finditer(INLINE_CODE.sub("", line)):
            target = match.group(1)
            if not target.startswith(EXTERNAL):
                yield number, target


def broken(path: Path, target: str) -> str | None:
    """Why `target`, linked from `path`, does not resolve; None when it does."""
    file_part, _, anchor = target.partition("#")
    linked = (path.parent / file_part).resolve() if file_part else path
    if not linked.exists():
        return f"no file {file_part}"
    if anchor and linked.suffix == ".md" and anchor not in anchors(linked):
        return f"no heading for #{anchor} in {file_part or path.name}"
    return None


def name(path: Path) -> str:
    return str(path.relative_to(ROOT))


@pytest.mark.parametrize("path", DOCUMENTS, ids=name)
def test_every_relative_link_and_anchor_resolves(path: Path) -> None:
    failures = [
        f"{name(path)}:{number}: ({target}) {reason}"
        for number, target in relative_links(path)
        if (reason := broken(path, target)) is not None
    ]
    assert failures == []


def test_the_readme_stays_an_operators_document() -> None:
    size = len(README.read_bytes())
    assert size <= README_MAX_BYTES, f"README.md is {size} bytes: move details into docs/"


@pytest.mark.parametrize("path", PAGES, ids=name)
def test_each_page_of_docs_stays_in_size(path: Path) -> None:
    size = len(path.read_bytes())
    assert size <= PAGE_MAX_BYTES, f"{name(path)} is {size} bytes: keep the current figures only"


def test_each_changelog_entry_is_one_short_line() -> None:
    long_entries = [
        f"CHANGELOG.md:{number}: {len(line)} characters"
        for number, line in prose_lines(CHANGELOG)
        if len(line) > CHANGELOG_MAX_CHARS
    ]
    assert long_entries == []


def test_the_anchor_rule_is_githubs() -> None:
    """Headings with code, punctuation and dashes, as the documents use them."""
    assert slug("The `nodes` estimate on bursts") == "the-nodes-estimate-on-bursts"
    assert slug("Request path before and after #15–#17") == "request-path-before-and-after-1517"
    assert slug("Decision (i): a lenient ceiling") == "decision-i-a-lenient-ceiling"
    assert slug("RLQS: no call per request") == "rlqs-no-call-per-request"


def test_a_broken_link_or_anchor_is_reported(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n## Same\n\n## Same\n\n[a](#same-1) [b](#none) [c](gone.md)\n")
    reasons = [broken(page, target) for _, target in relative_links(page)]
    assert reasons == [None, "no heading for #none in page.md", "no file gone.md"]
