"""Run every teaching notebook top to bottom, GPU cells included, and report each cell that fails.

``python scripts/run-notebooks.py [OUTDIR]`` executes each notebook in ``notebooks/`` in a Jupyter kernel
of this Python through nbclient (as JupyterLab would; cells tagged ``nbval-skip`` run too, since those are
the GPU cells nbval skips on a CPU), from ``notebooks/``, with a 300 s limit per cell. Without nbclient and
ipykernel it falls back to running each notebook's code cells as one plain script (``%``-magics dropped).

Writes ``OUTDIR/notebooks.json`` (per notebook: mode, ok, seconds, failing cell and error, and the text
each GPU cell printed) and ``OUTDIR/<notebook>.log``; prints one line per notebook. Exit 1 if any failed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"


def _text(outputs: list) -> str:
    parts = []
    for o in outputs:
        if o.get("output_type") == "stream":
            parts.append(o.get("text", ""))
        elif o.get("output_type") in ("display_data", "execute_result"):
            parts.append(o.get("data", {}).get("text/plain", ""))
        elif o.get("output_type") == "error":
            parts.append(f"{o.get('ename')}: {o.get('evalue')}")
    return "".join(parts)


def run_with_jupyter(path: Path, out: Path) -> dict:
    import nbformat
    from jupyter_client import KernelManager
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError
    from nbval.kernel import CURRENT_ENV_KERNEL_NAME, NbvalKernelspecManager

    nb = nbformat.read(path, as_version=4)
    km = KernelManager(kernel_name=CURRENT_ENV_KERNEL_NAME, kernel_spec_manager=NbvalKernelspecManager())
    client = NotebookClient(nb, km=km, timeout=300, record_timing=False,
                            resources={"metadata": {"path": str(NOTEBOOKS)}})
    result = {"notebook": path.name, "mode": "jupyter (nbclient)", "ok": True, "error": "", "cell": None}
    try:
        client.execute()
    except CellExecutionError as exc:
        result.update(ok=False, error=str(exc).strip().splitlines()[-1] if str(exc).strip() else repr(exc))
    code = [c for c in nb.cells if c.cell_type == "code"]
    failed = [i for i, c in enumerate(code) if any(o.get("output_type") == "error" for o in c.outputs)]
    if failed:
        result["cell"] = failed[0]
    result["gpu_cells"] = {i: _text(c.outputs) for i, c in enumerate(code)
                           if "nbval-skip" in c.metadata.get("tags", [])}
    log = [f"--- code cell {i} ---\n{''.join(c.source)}\n>>>\n{_text(c.outputs)}" for i, c in enumerate(code)]
    (out / (path.stem + ".log")).write_text("\n".join(log))
    return result


def run_as_script(path: Path, out: Path) -> dict:
    cells = json.loads(path.read_text())["cells"]
    code = ["from IPython.display import display"]
    for c in cells:
        if c["cell_type"] == "code":
            src = "".join(c["source"])
            code.append("\n".join(line for line in src.splitlines() if not line.lstrip().startswith("%")))
    script = out / (path.stem + ".py")
    script.write_text("\n\n".join(code) + "\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, str(script)], cwd=NOTEBOOKS, env=env,
                          capture_output=True, text=True, timeout=300)
    (out / (path.stem + ".log")).write_text(proc.stdout + "\n--- stderr ---\n" + proc.stderr)
    ok = proc.returncode == 0
    return {"notebook": path.name, "mode": "script", "ok": ok, "cell": None,
            "error": "" if ok else (proc.stderr.strip().splitlines() or ["?"])[-1]}


def main() -> int:
    if sys.argv[1:] and sys.argv[1] in ("-h", "--help"):
        print(__doc__.strip())
        return 0
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("/tmp/notebooks-run")
    out.mkdir(parents=True, exist_ok=True)
    try:
        import ipykernel  # noqa: F401
        import nbclient  # noqa: F401
        import nbval  # noqa: F401
        runner = run_with_jupyter
    except ImportError as exc:
        print(f"nbclient/ipykernel/nbval missing ({exc}): running the notebooks as plain scripts")
        runner = run_as_script
    results = []
    for path in sorted(NOTEBOOKS.glob("*.ipynb")):
        t0 = time.perf_counter()
        r = runner(path, out)
        r["seconds"] = round(time.perf_counter() - t0, 1)
        results.append(r)
        where = f" (code cell {r['cell']})" if r.get("cell") is not None else ""
        print(f"{path.name:32s} {'ok' if r['ok'] else 'FAILED'}{where} {r['seconds']:6.1f} s  {r['mode']}"
              f"  {r['error']}", flush=True)
    (out / "notebooks.json").write_text(json.dumps(results, indent=1))
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
