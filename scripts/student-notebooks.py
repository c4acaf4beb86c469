"""Write the student version of the teaching notebooks: every exercise's solution cleared.

``python scripts/student-notebooks.py [OUTDIR]`` (default ``build/student-notebooks``; ``make
student-notebooks``) copies ``notebooks/*.ipynb`` and ``notebooks/README.md`` to OUTDIR with each region
between ``### BEGIN SOLUTION`` and ``### END SOLUTION`` replaced by a stub that raises
``NotImplementedError``, using nbgrader's ``ClearSolutions`` preprocessor (the markers are nbgrader's, so
the notebooks also work in an nbgrader course). Outputs are cleared; cell tags are kept. The checking
cell after each exercise is unchanged: it fails until the learner writes a solution
(``tests/test_student_notebooks.py`` runs the student versions to prove it). Needs nbgrader (the
``dev`` extra).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
STUB = "# YOUR CODE HERE (see the exercise above)\nraise NotImplementedError(\"write your solution here\")"


def student_version(nb: nbformat.NotebookNode) -> tuple[nbformat.NotebookNode, int]:
    """``nb`` with its solutions cleared and its outputs removed, and how many regions were cleared.

    Raises ``ValueError`` for a ``BEGIN`` marker without its ``END`` (nbgrader would clear the rest of
    the cell silently).
    """
    from nbgrader.preprocessors import ClearSolutions

    nb = nbformat.from_dict(nb)
    regions = 0
    for i, cell in enumerate(nb.cells):
        begins, ends = cell.source.count(BEGIN), cell.source.count(END)
        if begins != ends:
            raise ValueError(f"cell {i}: {begins} '{BEGIN}' but {ends} '{END}'")
        regions += begins
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    nb, _ = ClearSolutions(code_stub={"python": STUB}, enforce_metadata=False).preprocess(nb, {})
    return nb, regions


def main(argv: list[str]) -> int:
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0
    out = Path(argv[0]) if argv else ROOT / "build" / "student-notebooks"
    out.mkdir(parents=True, exist_ok=True)
    for path in sorted(NOTEBOOKS.glob("*.ipynb")):
        nb, regions = student_version(nbformat.read(path, as_version=4))
        nbformat.write(nb, out / path.name)
        print(f"{path.name}: {regions} solution(s) cleared")
    shutil.copy(NOTEBOOKS / "README.md", out / "README.md")
    print(f"student notebooks in {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
