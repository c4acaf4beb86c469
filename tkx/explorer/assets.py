"""Front-end assets of tkx's widgets: see :mod:`tkx.render.assets` (the report inlines them too)."""

from ..render.assets import AssetMissingError, asset_path, read_asset

__all__ = ["AssetMissingError", "asset_path", "read_asset"]
