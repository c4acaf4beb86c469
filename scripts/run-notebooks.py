"""Run every notebook's code cells as a plain Python script (for machines without Jupyter, e.g. the GPU box).

``python scripts/run-notebooks.py [OUTDIR]``: each notebook in ``notebooks/`` becomes one script (cells in
order, ``%``-magics dropped), run in ``notebooks/`` with a 300 s limit; prints pass/fail and seconds per
notebook and writes ``OUTDIR/notebooks.json`` and one log per notebook. GPU cells run when CUDA is present.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path


def main() -> int:
    root = Path(__file__).resolve().parent.parent
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("/tmp/notebooks-run")
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for nb in sorted((root / "notebooks").glob("*.ipynb")):
        cells = json.loads(nb.read_text())["cells"]
        code = ["from IPython.display import display"]
        for c in cells:
            if c["cell_type"] != "code":
                continue
            src = "".join(c["source"])
            code.append("\n".join(line for line in src.splitlines() if not line.lstrip().startswith("%")))
        script = out / (nb.stem + ".py")
        script.write_text("\n\n".join(code) + "\n")
        t0 = time.perf_counter()
        env = dict(os.environ, PYTHONPATH=str(root) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        proc = subprocess.run([sys.executable, str(script)], cwd=root / "notebooks", env=env,
                              capture_output=True, text=True, timeout=300)
        seconds = time.perf_counter() - t0
        (out / (nb.stem + ".log")).write_text(proc.stdout + "\n--- stderr ---\n" + proc.stderr)
        ok = proc.returncode == 0
        last_error = "" if ok else (proc.stderr.strip().splitlines() or ["?"])[-1]
        results.append({"notebook": nb.name, "ok": ok, "seconds": round(seconds, 1), "error": last_error})
        print(f"{nb.name:32s} {'ok' if ok else 'FAILED'} {seconds:6.1f} s {last_error}", flush=True)
    (out / "notebooks.json").write_text(json.dumps(results, indent=1))
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
