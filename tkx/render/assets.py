"""Front-end assets (anywidget ES modules and CSS) of tkx's own widgets.

In a wheel they live in the package as ``tkx/_widgets/`` (``pyproject.toml`` force-includes
the repository's top-level ``widgets/`` folder there); in an editable install or a source
checkout they are read from ``widgets/`` next to the ``tkx`` package.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path


class AssetMissingError(FileNotFoundError):
    """A widget asset is in neither ``tkx/_widgets`` nor the checkout's ``widgets/``."""


def asset_path(name: str) -> Path | None:
    """Where ``name`` was found on disk (``None`` when only a non-file resource has it)."""
    packaged = resources.files("tkx").joinpath("_widgets", *name.split("/"))
    if packaged.is_file():
        return Path(str(packaged))
    checkout = Path(__file__).resolve().parents[2] / "widgets" / name
    return checkout if checkout.is_file() else None


def read_asset(name: str) -> str:
    """The text of widget asset ``name`` (e.g. ``"linked.js"``)."""
    packaged = resources.files("tkx").joinpath("_widgets", *name.split("/"))
    if packaged.is_file():
        return packaged.read_text(encoding="utf-8")
    checkout = Path(__file__).resolve().parents[2] / "widgets" / name
    if checkout.is_file():
        return checkout.read_text(encoding="utf-8")
    raise AssetMissingError(f"widget asset {name!r} not found in tkx/_widgets (installed wheel) nor in "
                            f"{checkout.parent} (source checkout); reinstall tkx")
