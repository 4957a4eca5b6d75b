"""The documentation: README.md and docs/*.md link only to files that exist, and `make docs` builds a
static site (mkdocs --strict: every page-to-page link and anchor resolves) whose every internal link,
image and script resolves inside the site, with nothing fetched from the network."""

from __future__ import annotations

import os
import re
import shutil
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


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """``make docs``'s site, built once (mkdocs --strict, the Material theme)."""
    pytest.importorskip("mkdocs", reason="the docs site needs mkdocs (pip install 'dtrlab[docs]')")
    pytest.importorskip("material", reason="the docs site's theme is mkdocs-material (pip install 'dtrlab[docs]')")
    site = tmp_path_factory.mktemp("docs") / "site"
    build = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
                           cwd=ROOT, capture_output=True, text=True, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert build.returncode == 0, build.stderr[-3000:]
    return site


def test_make_docs_builds_an_offline_site(site):
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


def test_the_site_uses_material_offline_with_grouped_navigation(site):
    """Material for MkDocs with its web fonts off (no Google Fonts) and no CDN anywhere: no stylesheet
    imports or loads from the network, and the four groups are the navigation's tabs."""
    index = (site / "index.html").read_text()
    assert "assets/stylesheets/main." in index and "fonts.googleapis" not in index and "unpkg.com" not in index
    for css in site.rglob("*.css"):
        assert not re.search(r"(@import|url\()\s*['\"]?(https?:)?//", css.read_text()), css
    tabs = re.findall(r'class="md-tabs__link[^"]*"[^>]*>\s*([^<]+?)\s*<', index)
    assert tabs == ["Start", "The questions", "Subsystems", "Reference"], tabs


def test_a_new_page_joins_the_reference_group(tmp_path):
    """A docs page not named in the hook's groups still appears in the navigation (under Reference); a named
    page that is gone leaves it."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("mkdocs_hooks", ROOT / "mkdocs_hooks.py")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    for name in ("index.md", "cli.md", "zz-new.md"):
        (tmp_path / name).write_text("# page\n")
    nav = hooks.on_config({"docs_dir": str(tmp_path)})["nav"]
    groups = {group: entries for item in nav for group, entries in item.items()}
    assert groups["Start"] == [{"Home": "index.md"}, {"The command line": "cli.md"}]
    assert groups["Reference"] == ["zz-new.md"] and groups["Subsystems"] == []


CHROMIUM = next((p for p in (os.environ.get("DTRLAB_CHROMIUM"), shutil.which("chromium"), "/usr/bin/chromium")
                 if p and Path(p).exists()), None)


@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium (apt-get install chromium, or set DTRLAB_CHROMIUM)")
def test_the_site_opens_offline_in_a_browser(site):
    """Two pages in headless Chromium from the file system: the theme's navigation tabs render, and no
    request leaves file: (nothing from a CDN, no web fonts)."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="needs playwright (pip install 'dtrlab[browser]')")
    requests = []
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--headless", "--no-sandbox",
                                                                            "--disable-gpu"])
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.on("request", lambda request: requests.append(request.url))
        for name in ("index.html", "compile.html"):
            page.goto((site / name).as_uri())
            page.wait_for_load_state("networkidle")
            assert page.locator(".md-tabs__link").count() == 4
        browser.close()
    assert requests and all(url.startswith(("file:", "data:")) for url in requests), requests
