"""mkdocs hooks: the repository's files the pages link outside docs/ (benchmark results, deploy/, the
README) built into the site under `repository/`, with every link to them rewritten, so that the site
has no link to nowhere. A linked Markdown file is a page of its own (its links followed in turn), any
other file is copied as it is, and a linked folder gets a page listing its files."""

from __future__ import annotations

import posixpath
import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

REPO = Path(__file__).resolve().parents[2]
PREFIX = "repository/"
LINK = re.compile(r"(\]\()([^)\s#]+)(#[^)\s]*)?(\))")  # [text](target#anchor), images too


def _repo_path(src_uri: str) -> str:
    """Where a site file's source lies in the repository."""
    return src_uri[len(PREFIX):] if src_uri.startswith(PREFIX) else f"docs/{src_uri}"


def _site_uri(src_uri: str, target: str) -> str | None:
    """The site file a link from `src_uri` to `target` names (None: not a file of the repository)."""
    if re.match(r"^[a-z]+:|^/", target):
        return None  # (a URL, an absolute path)
    path = posixpath.normpath(posixpath.join(posixpath.dirname(_repo_path(src_uri)), target))
    if path.startswith("..") or not (REPO / path).exists():
        return None
    if path.startswith("docs/") and not path.startswith("docs/_hooks"):
        return path[len("docs/"):]
    return PREFIX + path + ("/index.md" if (REPO / path).is_dir() else "")


def on_files(files: Files, config: Any) -> Files:
    queue = [f.src_uri for f in files.documentation_pages()]
    while queue:
        src_uri = queue.pop()
        source = REPO / _repo_path(src_uri)
        text = source.read_text(encoding="utf-8") if source.is_file() else ""
        for _, target, _, _ in LINK.findall(text):
            site = _site_uri(src_uri, target)
            if site is None or not site.startswith(PREFIX) or files.get_file_from_path(site) is not None:
                continue
            path = REPO / site[len(PREFIX):].removesuffix("/index.md")
            if path.is_dir():  # a page listing the folder's files, and the files
                names = sorted(p.name for p in path.iterdir() if p.is_file())
                listing = f"# {site[len(PREFIX):].removesuffix('/index.md')}\n\n" + "".join(f"- [{n}]({n})\n" for n in names)
                files.append(File.generated(config, site, content=listing))
                entries = [(posixpath.join(posixpath.dirname(site), n), path / n) for n in names]
            else:
                entries = [(site, path)]
            for uri, found in entries:
                if files.get_file_from_path(uri) is None:
                    files.append(File.generated(config, uri, abs_src_path=str(found)))
                    if uri.endswith(".md"):
                        queue.append(uri)
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    src_uri = page.file.src_uri

    def rewritten(match: re.Match[str]) -> str:
        site = _site_uri(src_uri, match.group(2))
        if site is None or not site.startswith(PREFIX) and not src_uri.startswith(PREFIX):
            return match.group(0)
        relative = posixpath.relpath(site, posixpath.dirname(src_uri) or ".")
        return f"{match.group(1)}{relative}{match.group(3) or ''}{match.group(4)}"

    return LINK.sub(rewritten, markdown)
