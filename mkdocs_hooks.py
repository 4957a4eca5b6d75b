"""MkDocs hooks for `make docs` (mkdocs.yml): the navigation, the figures, and links out of docs/.

* The navigation is ``index.md`` and then every other ``docs/*.md`` in name order, so a new page
  needs no entry anywhere, followed by a Figures page.
* The Figures page is ``figures/README.md`` (what each figure shows) followed by every PNG under
  ``figures/``, copied into the site at the same paths.
* A docs page links to the repository's other files with ``../PATH`` (so the links work on the
  repository's own pages too). In the site, a link to a figure goes to its copy, one to
  ``figures/README.md`` to the Figures page; any other becomes the path in code (the site holds only
  the documentation).
"""

from __future__ import annotations

import re
from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parent
FIGURES = ROOT / "figures"
FIGURES_PAGE = "figures.md"
#: A markdown link or image whose target leaves docs/: ``[text](../path#anchor)``.
OUTSIDE = re.compile(r"(!?)\[([^\]]*)\]\(\.\./([^)#\s]+)(#[^)\s]*)?\)")


def on_config(config):
    pages = sorted(p.name for p in Path(config["docs_dir"]).glob("*.md") if p.name != "index.md")
    config["nav"] = [{"Home": "index.md"}, *pages, {"Figures": FIGURES_PAGE}]
    return config


def on_files(files, config):
    for png in sorted(FIGURES.rglob("*.png")):
        files.append(File(str(png.relative_to(ROOT)), str(ROOT), config["site_dir"], config["use_directory_urls"]))
    files.append(File.generated(config, FIGURES_PAGE, content=_figures_page()))
    return files


def on_page_markdown(markdown, page, config, files):
    return OUTSIDE.sub(_outside_link, markdown)


def _outside_link(match: re.Match) -> str:
    image, text, path, anchor = match.group(1), match.group(2), match.group(3), match.group(4) or ""
    if path.startswith("figures/") and path.endswith(".png"):
        return f"{image}[{text}]({path})"
    if path == "figures/README.md":
        return f"[{text}]({FIGURES_PAGE})"
    return f"{text} (`{path}{anchor}` in the repository)" if text.strip("`") != path else f"`{path}`"


def _figures_page() -> str:
    readme = (FIGURES / "README.md").read_text()
    body = readme.split("\n", 1)[1] if readme.startswith("# ") else readme
    gallery = [f"### `{png.relative_to(FIGURES).with_suffix('')}`\n\n![{png.stem}]({png.relative_to(ROOT)})\n"
               for png in sorted(FIGURES.rglob("*.png"))]
    return "# Figures\n" + body + "\n\n## Every figure\n\n" + "\n".join(gallery)
