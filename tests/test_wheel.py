"""The built wheel carries the widgets' front-end assets (hatchling drops a top-level folder
unless pyproject force-includes it) and the explorer package.

Builds with ``python -m build --wheel --no-isolation`` (``build`` and ``hatchling`` come with
the ``dev`` extra), so no network is needed; a few seconds.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(importlib.util.find_spec("build") is None or importlib.util.find_spec("hatchling") is None,
                    reason="needs the dev extra: pip install -e '.[dev]' (build, hatchling)")
def test_wheel_contains_widget_assets(tmp_path):
    r = subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(tmp_path),
                        str(ROOT)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (wheel,) = tmp_path.glob("tkx-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assets = sorted(p.relative_to(ROOT / "widgets").as_posix() for p in (ROOT / "widgets").rglob("*")
                    if p.suffix in (".js", ".css") or p.name.endswith("LICENSE.txt"))
    assert {"linked.js", "linked.css", "hgraph.js", "hgraph.css", "vendor/dagre.min.js",
            "vendor/dagre.LICENSE.txt"} <= set(assets)
    for name in assets:
        assert f"tkx/_widgets/{name}" in names, f"{name} missing from the wheel"
    assert "tkx/explorer/widget.py" in names and "tkx/explorer/linked.py" in names
    assert not any(n.startswith("widgets/") for n in names)  # only under tkx/_widgets
    # what the installed package reads is byte-identical to the checkout
    with zipfile.ZipFile(wheel) as z:
        for name in ("linked.js", "vendor/dagre.min.js"):
            assert z.read(f"tkx/_widgets/{name}") == (ROOT / "widgets" / name).read_bytes()
