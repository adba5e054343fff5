"""The README and docs/ point at files that exist, and every registered algorithm has its paper in
docs/references.md."""

import re
from pathlib import Path

from p2pfl.algorithms import REGISTRY

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def anchors(page: Path) -> set[str]:
    """The anchors a Markdown page's headings get (lower case, punctuation dropped, spaces as hyphens)."""
    return {
        re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")
        for title in re.findall(r"^#+ (.+)$", page.read_text(), re.M)
    }


def test_every_relative_link_resolves():
    broken = []
    for page in PAGES:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if "://" in target:
                continue
            path, _, anchor = target.partition("#")
            linked = page.parent / path if path else page
            if not linked.exists() or (anchor and linked.suffix == ".md" and anchor not in anchors(linked)):
                broken.append(f"{page.relative_to(ROOT)} -> {target}")
    assert broken == []


def test_every_algorithm_has_its_paper_in_the_references():
    table = (ROOT / "docs" / "references.md").read_text()
    named = set(re.findall(r"^\| ([^|]+) \|", table, re.M))
    listed = {name.strip("` ") for cell in named for name in cell.split(",")}
    assert set(REGISTRY) - listed == set()
