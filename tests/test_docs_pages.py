"""The docs stay readable and linked: every `docs/benchmarks/*.md` page states its findings in at
most 300 lines, and every relative Markdown link under `docs/` points to a file that exists."""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
MAX_LINES = 300

_FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.M | re.S)
_CODE = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"!?\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_EXTERNAL = re.compile(r"^(?:[a-z][a-z0-9+.-]*:|//|#)", re.I)


def _links(text: str) -> list[str]:
    """The link targets of a Markdown text, code blocks and code spans left out."""
    text = _CODE.sub("", _FENCE.sub("", text))
    return [m.group(1) for m in _LINK.finditer(text)]


def test_the_link_finder_sees_links_and_skips_code():
    text = ("[a](x.md) ![b](img/p.png#z) [c](https://e.org) [d](#top)\n"
            "`[e](not.md)`\n```\n[f](not2.md)\n```\n[g](p.md \"title\")")
    assert _links(text) == ["x.md", "img/p.png#z", "https://e.org", "#top", "p.md"]


def test_every_benchmark_page_fits_in_300_lines():
    pages = sorted((DOCS / "benchmarks").glob("*.md"))
    assert pages, "no docs/benchmarks/*.md pages found"
    too_long = {str(p.relative_to(REPO)): n for p in pages
                if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert too_long == {}, (
        f"pages over {MAX_LINES} lines (state each finding as question, answer, table, command; "
        f"split a page by topic if it cannot hold them): "
        + ", ".join(f"{page}: {n} lines" for page, n in too_long.items()))


def test_every_relative_link_in_docs_points_to_a_file():
    broken = []
    for page in sorted(DOCS.rglob("*.md")):
        for target in _links(page.read_text()):
            if _EXTERNAL.match(target):
                continue
            path = target.split("#", 1)[0].split("?", 1)[0]
            if not (page.parent / path).exists():
                broken.append(f"{page.relative_to(REPO)} -> {target}")
    assert broken == [], "relative links to files that do not exist:\n" + "\n".join(broken)
