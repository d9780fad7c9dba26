"""README.md and docs/: every relative link and #anchor resolves, and no table row is over 300 characters."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
MAX_ROW = 300
FENCE = re.compile(r"^\s*(```|~~~)")
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+\1")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
HTML_ANCHOR = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"")
EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)


def prose(text: str) -> list[tuple[int, str]]:
    """(line number, line) of every line outside fenced code blocks."""
    lines, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            lines.append((number, line))
    return lines


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: its text, lowercased, punctuation dropped, spaces as hyphens."""
    text = CODE_SPAN.sub(lambda span: span.group(0).strip("`"), heading)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every anchor of a page: its headings' slugs (repeats numbered as GitHub does) and HTML anchors."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    for _, line in prose(page.read_text(encoding="utf-8")):
        if heading := re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line):
            base = slug(heading.group(1))
            found.add(f"{base}-{seen[base]}" if base in seen else base)
            seen[base] = seen.get(base, 0) + 1
        found.update(HTML_ANCHOR.findall(line))
    return found


def broken_links(page: Path, root: Path = ROOT) -> list[str]:
    """Each relative link of `page` whose file, or whose #anchor in a Markdown file, does not exist."""
    broken = []
    for number, line in prose(page.read_text(encoding="utf-8")):
        for target in LINK.findall(CODE_SPAN.sub("", line)):
            if EXTERNAL.match(target):
                continue
            path, _, anchor = target.partition("#")
            resolved = (page.parent / path).resolve() if path else page
            where = f"{page.relative_to(root)}:{number}: {target}"
            if not resolved.exists():
                broken.append(f"{where} (no such file)")
            elif anchor and (resolved.suffix != ".md" or anchor not in anchors(resolved)):
                broken.append(f"{where} (no such anchor)")
    return broken


def long_rows(page: Path, root: Path = ROOT) -> list[str]:
    """Each Markdown table row of `page` over MAX_ROW characters."""
    return [
        f"{page.relative_to(root)}:{number}: {len(line)} characters"
        for number, line in prose(page.read_text(encoding="utf-8"))
        if line.lstrip().startswith("|") and len(line) > MAX_ROW
    ]


def test_the_docs_tree_has_its_pages() -> None:
    assert len(PAGES) > 10
    assert all(page.read_text(encoding="utf-8").startswith("# ") for page in PAGES)


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    assert broken_links(page) == []


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_no_table_row_is_too_long(page: Path) -> None:
    assert long_rows(page) == []


def test_the_checks_find_broken_links_anchors_and_long_rows(tmp_path: Path) -> None:
    (tmp_path / "guide.md").write_text("# A guide\n\n## The `pool` (Kueue)\n\n## Notes\n\n## Notes\n")
    page = tmp_path / "README.md"
    page.write_text(
        "# Title\n\n"
        "[ok](guide.md#the-pool-kueue) [ok](guide.md#notes-1) [ok](#title) [web](https://example.com/x#y)\n"
        "`[code](missing.md)` [gone](missing.md) [bad anchor](guide.md#nope) ![img](images/none.png)\n"
        "```\n[in a fence](missing.md)\n| " + "x" * 400 + " |\n```\n"
        "| short | row |\n| " + "y" * 300 + " |\n"
    )
    assert broken_links(page, tmp_path) == [
        "README.md:4: missing.md (no such file)",
        "README.md:4: guide.md#nope (no such anchor)",
        "README.md:4: images/none.png (no such file)",
    ]
    assert long_rows(page, tmp_path) == ["README.md:10: 304 characters"]
