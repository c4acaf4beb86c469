"""Execute the teaching notebooks and store the outputs that ``make test`` compares with nbval.

``python scripts/store-notebook-outputs.py [NOTEBOOK ...]`` (default: every notebook in ``notebooks/``)
runs each notebook top to bottom in a fresh kernel of this Python (as ``pytest --nbval-current-env``
does), from ``notebooks/``, then rewrites it under one policy (``tests/test_notebook_policy.py`` checks it):

- the lax notebooks (:data:`LAX`, run with ``--nbval-lax``) keep no outputs at all;
- a cell tagged ``nbval-skip`` (GPU cells) or ``nbval-ignore-output`` keeps no outputs;
- a cell whose output is more than plain text (HTML views, SVG, widgets) is tagged
  ``nbval-ignore-output`` and keeps no outputs: nbval would compare megabytes of markup that
  changes with graphviz and pygments versions;
- every other cell keeps its text outputs, which ``pytest --nbval`` compares after the
  substitutions in ``notebooks/sanitize.cfg`` (timings, addresses, versions, register counts).

Execution counts stay only on cells with stored outputs (nbval needs them), timing metadata and widget
state are dropped, the notebook metadata is kept as it was, and a cell whose new output equals the stored
one after sanitizing keeps the stored one: a re-run changes the files only where an output really changed.
Fails (exit 1) on a cell error.
"""

from __future__ import annotations

import copy
import re
import sys
from pathlib import Path
from typing import Any

import nbformat
from jupyter_client import KernelManager
from nbclient import NotebookClient
from nbval.kernel import CURRENT_ENV_KERNEL_NAME, NbvalKernelspecManager
from nbval.plugin import get_sanitize_patterns

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
#: Notebooks whose outputs depend on the machine (measured timings): tested with ``--nbval-lax``.
LAX = ("06_run_and_benchmark.ipynb",)
IGNORE, SKIP = "nbval-ignore-output", "nbval-skip"


def rich(output: dict) -> bool:
    """True for an output that carries more than ``text/plain``."""
    return output.get("output_type") in ("display_data", "execute_result") and \
        set(output.get("data", {})) != {"text/plain"}


def _sanitized(outputs: list) -> list:
    """``outputs`` as nbval compares them: text only, after the patterns in ``notebooks/sanitize.cfg``."""
    patterns = get_sanitize_patterns((NOTEBOOKS / "sanitize.cfg").read_text())

    def clean(text: Any) -> str:
        text = "".join(text) if isinstance(text, list) else str(text)
        for regex, replace in patterns:
            text = re.sub(regex, replace, text)
        return text

    return [(o.get("output_type"), clean(o.get("text", "")),
             {k: clean(v) for k, v in o.get("data", {}).items()}) for o in outputs]


def store(path: Path) -> list[str]:
    """Execute ``path`` and rewrite it under the policy; returns one line per tag added."""
    nb = nbformat.read(path, as_version=4)
    stored = [copy.deepcopy(c) for c in nb.cells]
    metadata = copy.deepcopy(nb.metadata)
    km = KernelManager(kernel_name=CURRENT_ENV_KERNEL_NAME, kernel_spec_manager=NbvalKernelspecManager())
    NotebookClient(nb, km=km, timeout=300, record_timing=False,
                   resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
    metadata.pop("widgets", None)  # widget state: model ids change on every run
    nb.metadata = metadata
    notes = []
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        for key in ("execution", "collapsed", "scrolled"):
            cell.metadata.pop(key, None)
        tags = cell.metadata.setdefault("tags", [])
        if any(rich(o) for o in cell.outputs) and IGNORE not in tags and SKIP not in tags:
            tags.append(IGNORE)
            notes.append(f"{path.name} cell {index}: rich output, tagged {IGNORE}")
        if not tags:
            del cell.metadata["tags"]
        if path.name in LAX or IGNORE in tags or SKIP in tags:
            cell.outputs = []
        if not cell.outputs:  # nbval treats a cell with outputs and no execution count as unrun
            cell.execution_count = None
        for output in cell.outputs:
            if "metadata" in output:
                output["metadata"] = {}
        old = stored[index]
        if old.get("outputs") and old.source == cell.source and _sanitized(old.outputs) == _sanitized(cell.outputs):
            cell.outputs, cell.execution_count = old.outputs, old.execution_count  # only timings differ
    nbformat.write(nb, path)
    return notes


def main(argv: list[str]) -> int:
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0
    paths = [Path(a).resolve() for a in argv] or sorted(NOTEBOOKS.glob("*.ipynb"))
    for path in paths:
        try:
            notes = store(path)
        except Exception as exc:  # a cell raised: report it and stop
            print(f"{path.name}: FAILED\n{exc}", file=sys.stderr)
            return 1
        print(f"{path.name}: stored" + "".join(f"\n  {n}" for n in notes))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
