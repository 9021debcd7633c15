"""The README and the pages in docs/: every link to a file of the repository and every anchor resolves,
the README stays a first page (not the manual), and the site builds with `mkdocs build --strict`."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def anchors(page: Path) -> set[str]:
    """The anchors of a page's headings, as GitHub makes them (the links are written for it)."""
    found, fence = set(), False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fence = not fence
        elif not fence and line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            found.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return found


def links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)  # (not inside code)
    return [target for target in LINK.findall(text) if not re.match(r"[a-z]+:", target)]


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_link_to_the_repository_and_every_anchor_resolves(page):
    broken = []
    for target in links(page):
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists() or REPO not in (linked, *linked.parents):
            broken.append(f"{target}: no such file in the repository")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{target}: no heading makes #{anchor}")
    assert not broken, f"{page.name}: " + "; ".join(broken)


def test_the_readme_is_a_first_page():
    lines = (REPO / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= 300, f"README.md has {lines} lines: what is not the first hour goes to docs/"


@pytest.mark.skipif(shutil.which("mkdocs", path=str(Path(sys.executable).parent)) is None,
                    reason="mkdocs is not installed (the test extra installs it)")
def test_the_site_builds_strictly(tmp_path):
    mkdocs = shutil.which("mkdocs", path=str(Path(sys.executable).parent))
    done = subprocess.run([mkdocs, "build", "--strict", "--site-dir", str(tmp_path / "site")], cwd=REPO,
                          capture_output=True, text=True, env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr[-3000:]
    site = tmp_path / "site"
    assert (site / "configuration" / "index.html").exists()
    # Every link and asset of every built page lands on a file of the site (the repository's files the
    # pages link, under repository/); nothing is fetched from elsewhere but what a page links on purpose.
    broken, pages = [], sorted(site.rglob("*.html"))
    for page in pages:
        html = page.read_text(encoding="utf-8")
        assert "fonts.googleapis" not in html and "fonts.gstatic" not in html, page
        for target in re.findall(r'(?:href|src)="([^"]+)"', html):
            if re.match(r"^[a-z]+:|^#|^//", target):
                continue
            bare = target.split("#")[0].split("?")[0]
            path = (site / bare.lstrip("/") if bare.startswith("/") else page.parent / bare).resolve()  # (404.html: from the root)
            if not (path.is_file() or (path / "index.html").is_file()):
                broken.append(f"{page.relative_to(site)} -> {target}")
    assert len(pages) > 100 and not broken, broken[:20]
    assert "inferd" in (site / "repository" / "index.html").read_text()  # (the README, the home page's first link)
