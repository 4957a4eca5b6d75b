"""The documentation: README.md and docs/*.md link only to files that exist, and `make docs` builds a
static site (mkdocs --strict: every page-to-page link and anchor resolves) whose every internal link,
image and script resolves inside the site, with nothing fetched from the network."""

from __future__ import annotations

import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
#: A markdown link or image target: ``[text](target)``, without the optional title.
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def markdown_links(path: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)  # code blocks hold no links
    return LINK.findall(text)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve_in_the_repository(page):
    for target in markdown_links(page):
        parts = urlsplit(target)
        if parts.scheme or target.startswith("#"):
            continue
        assert (page.parent / unquote(parts.path)).exists(), f"{page.relative_to(ROOT)} links to missing {target}"


def test_readme_is_a_front_page():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 150
    assert "dtrlab check" in readme and "docs/index.md" in readme


class _Links(HTMLParser):
    def __init__(self):
        super().__init__()
        self.links: list[tuple[str, str, str]] = []  # (tag, attribute, value)
        self.ids: set[str] = set()

    def handle_starttag(self, tag, attrs):
        for name, value in attrs:
            if name == "id" and value:
                self.ids.add(value)
            if name in ("href", "src") and value:
                self.links.append((tag, name, value))


def test_make_docs_builds_an_offline_site(tmp_path):
    pytest.importorskip("mkdocs", reason="the docs site needs mkdocs (pip install 'dtrlab[docs]')")
    site = tmp_path / "site"
    build = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
                           cwd=ROOT, capture_output=True, text=True)
    assert build.returncode == 0, build.stderr[-3000:]
    for page in (ROOT / "docs").glob("*.md"):  # the navigation picks up every page
        assert (site / page.with_suffix(".html").name).is_file(), page
    parsed = {}
    for html in site.rglob("*.html"):
        if html.name == "404.html":  # a web server's error page: links from the site root, by design
            continue
        parsed[html] = _Links()
        parsed[html].feed(html.read_text())
    figures = sorted(p.relative_to(ROOT) for p in (ROOT / "figures").rglob("*.png"))
    assert figures and all((site / figure).is_file() for figure in figures)
    images = 0
    for html, links in parsed.items():
        for tag, attribute, value in links.links:
            parts = urlsplit(value)
            if parts.scheme in ("http", "https") or value.startswith("//"):
                # Only plain links may leave the site; nothing is loaded from the network.
                assert tag == "a", f"{html.relative_to(site)} loads {value} from the network"
                continue
            if parts.scheme in ("mailto", "data"):
                continue
            target = (html.parent / unquote(parts.path)).resolve() if parts.path else html
            if target.is_dir():
                target = target / "index.html"
            assert target.is_file(), f"{html.relative_to(site)}: {tag} {attribute}={value} resolves to nothing"
            images += tag == "img"
            if parts.fragment and target.suffix == ".html" and target in parsed:
                assert parts.fragment in parsed[target].ids, f"{html.relative_to(site)}: no anchor {value}"
    assert images >= len(figures)
