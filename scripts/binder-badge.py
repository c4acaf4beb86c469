"""Print the README's Binder badge, built from the one setting that names the repository.

``python scripts/binder-badge.py`` reads ``Repository`` under ``[project.urls]`` in ``pyproject.toml``
(a ``https://github.com/OWNER/REPO`` URL) and prints the Markdown badge that opens
``notebooks/00_tour.ipynb`` on Binder in JupyterLab. Without that setting it says so and exits 1: the
README carries no badge until the repository has a public URL.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = "notebooks/00_tour.ipynb"


def repository() -> tuple[str, str] | None:
    """``(owner, repo)`` from ``[project.urls] Repository`` when it is a GitHub URL, else ``None``."""
    urls = tomllib.loads((ROOT / "pyproject.toml").read_text()).get("project", {}).get("urls", {})
    m = re.fullmatch(r"https://github\.com/([^/]+)/([^/]+?)(?:\.git)?/?", urls.get("Repository", ""))
    return (m[1], m[2]) if m else None


def badge(owner: str, repo: str, ref: str = "HEAD") -> str:
    url = f"https://mybinder.org/v2/gh/{owner}/{repo}/{ref}?urlpath=lab/tree/{NOTEBOOK}"
    return f"[![Binder](https://mybinder.org/badge_logo.svg)]({url})"


def main() -> int:
    if sys.argv[1:] and sys.argv[1] in ("-h", "--help"):
        print(__doc__.strip())
        return 0
    found = repository()
    if found is None:
        print("no GitHub URL in pyproject.toml ([project.urls] Repository = \"https://github.com/OWNER/REPO\"): "
              "the README has no Binder badge until the repository is published", file=sys.stderr)
        return 1
    print(badge(*found))
    return 0


if __name__ == "__main__":
    sys.exit(main())
