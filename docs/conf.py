"""Sphinx configuration of the tkx documentation (built offline by ``make docs``)."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.abspath(".."))

project = "tkx"
author = "the tkx developers"
copyright = "2026, the tkx developers"  # the footer reads "© 2026, the tkx developers."
extensions = ["myst_nb", "sphinx.ext.autodoc", "sphinx.ext.napoleon", "sphinx.ext.viewcode"]
source_suffix = {".md": "myst-nb", ".ipynb": "myst-nb"}
exclude_patterns = ["_build", "README.md", "notebooks/README.md", "results/*.json", "results/*.txt",
                    "jupyter_execute"]
html_theme = "alabaster"  # bundled with Sphinx: no network needed
html_static_path: list[str] = []
nb_execution_mode = "force"            # the CPU notebooks run at build time
nb_execution_timeout = 180
nb_execution_raise_on_error = True
nb_execution_show_tb = True
autodoc_member_order = "bysource"
autodoc_typehints = "none"
napoleon_numpy_docstring = True
napoleon_google_docstring = False
myst_heading_anchors = 3
suppress_warnings = ["myst.header", "mystnb.unknown_mime_type", "misc.highlighting_failure",
                     "myst.xref_missing"]
nitpicky = False
