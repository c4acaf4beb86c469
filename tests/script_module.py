"""Load a file of ``scripts/`` (most have no ``.py`` suffix) as a module, for the tests of the scripts."""

from __future__ import annotations

import importlib.machinery
import importlib.util
from pathlib import Path
from types import ModuleType

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"


def load_script(file: str, name: str | None = None) -> ModuleType:
    """``scripts/<file>`` executed as a fresh module named ``name`` (default: from the file name)."""
    path = SCRIPTS / file
    loader = importlib.machinery.SourceFileLoader(name or "tkx_script_" + path.stem.replace("-", "_"), str(path))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod
