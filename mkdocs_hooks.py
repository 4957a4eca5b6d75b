"""MkDocs hooks for `make docs` (mkdocs.yml): the navigation, the figures, and links out of docs/.

* The navigation has four groups (:data:`NAV_GROUPS`): start, the questions, subsystems and
  reference; a ``docs/*.md`` page not named there joins the reference group by itself (name order), so a
  new page needs no entry anywhere. The Figures page (below) is among the questions.
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


#: The navigation's groups and their pages, in order, with a short title (the sidebar is narrow; the page
#: keeps its own first heading).
NAV_GROUPS = {
    "Start": [{"Home": "index.md"}, {"Reproducing and testing": "reproduce.md"}, {"The command line": "cli.md"}],
    "The questions": [{"Results": "results.md"}, {"torch.compile's memory knob": "compile.md"},
                      {"Figures": FIGURES_PAGE}],
    "Subsystems": [{"Runtime": "runtime.md"}, {"Memory models": "memory.md"}, {"Sweeps and holes": "sweeps.md"},
                   {"Causal analysis": "causal.md"}, {"Policies": "policies.md"}, {"Exact solvers": "solvers.md"},
                   {"Real execution": "execute.md"}],
    "Reference": [{"Fidelity to simrd": "fidelity.md"}, {"Speed": "speed.md"},
                  {"What is in the package": "architecture.md"}],
}


def on_config(config):
    pages = sorted(p.name for p in Path(config["docs_dir"]).glob("*.md"))
    existing = {*pages, FIGURES_PAGE}
    groups = {group: [e for e in entries if _page(e) in existing] for group, entries in NAV_GROUPS.items()}
    named = {_page(e) for entries in NAV_GROUPS.values() for e in entries}
    groups["Reference"] += [page for page in pages if page not in named]
    config["nav"] = [{group: entries} for group, entries in groups.items()]
    return config


def _page(entry) -> str:
    """A navigation entry's file: ``"new.md"`` (a page not named in :data:`NAV_GROUPS`) or ``{"Home": "index.md"}``."""
    return entry if isinstance(entry, str) else next(iter(entry.values()))


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
