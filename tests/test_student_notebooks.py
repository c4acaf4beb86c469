"""The student versions of the notebooks (scripts/student-notebooks.py, nbgrader's ClearSolutions): every
notebook has at least two exercises; no solution line survives; and run top to bottom, each cleared
solution raises NotImplementedError, the checking cell after it fails, and every other cell still runs -
so no check passes without a solution and no tutorial cell depends on one."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
pytest.importorskip("nbgrader")
nbclient = pytest.importorskip("nbclient")

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
_spec = importlib.util.spec_from_file_location("student_notebooks", ROOT / "scripts" / "student-notebooks.py")
student = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(student)


def _solution_lines(source: str) -> list[str]:
    lines = source.split("\n")
    a, b = lines.index(student.BEGIN), lines.index(student.END)
    return [line for line in lines[a + 1:b] if line.strip()]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_student_version_clears_every_solution_and_every_check_then_fails(path):
    from jupyter_client import KernelManager
    from nbval.kernel import CURRENT_ENV_KERNEL_NAME, NbvalKernelspecManager

    teacher = nbformat.read(path, as_version=4)
    nb, regions = student.student_version(teacher)
    assert regions >= 2, f"{path.name}: {regions} exercise(s); each notebook needs at least two"
    code_t = [c for c in teacher.cells if c.cell_type == "code"]
    code_s = [c for c in nb.cells if c.cell_type == "code"]
    stubs = {i for i, c in enumerate(code_s) if "NotImplementedError" in c.source and "YOUR CODE HERE" in c.source}
    assert len(stubs) == regions
    for i in stubs:
        for line in _solution_lines(code_t[i].source):
            assert line not in code_s[i].source.split("\n"), f"{path.name} cell {i}: solution line kept: {line}"
    assert all(not c.outputs for c in code_s), "student notebooks carry no outputs"

    km = KernelManager(kernel_name=CURRENT_ENV_KERNEL_NAME, kernel_spec_manager=NbvalKernelspecManager())
    nbclient.NotebookClient(nb, km=km, timeout=300, allow_errors=True,
                            resources={"metadata": {"path": str(ROOT / "notebooks")}}).execute()
    errors = {i: [o for o in c.outputs if o.output_type == "error"] for i, c in enumerate(code_s)}
    checks = {i + 1 for i in stubs}
    for i in stubs:
        assert [e.ename for e in errors[i]] == ["NotImplementedError"], f"{path.name} cell {i}: {errors[i]}"
    for i in checks:
        assert errors[i], f"{path.name} cell {i}: the check passed without a solution:\n{code_s[i].source}"
    for i, errs in errors.items():
        if i not in stubs and i not in checks:
            assert not errs, (f"{path.name} cell {i} fails without the exercise solutions "
                              f"({errs[0].ename}: {errs[0].evalue}); tutorial cells must not depend on them")
