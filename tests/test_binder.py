"""binder/ gives Binder (repo2docker) what every CPU cell of the notebooks needs, checked offline.

repo2docker runs ``pip install -r binder/requirements.txt`` from the repository root after copying
the repository into the image, installs ``binder/apt.txt`` with apt-get and picks Python from
``binder/runtime.txt``; JupyterLab, ipykernel and ipywidgets come from its own environment (see
binder/README.md). These tests read those files with ``packaging`` and check them against
pyproject.toml, the Makefile and what the notebooks and tkx import. The set of distributions the
Binder requirements install is worked out from pyproject's extras and, for everything below them,
the metadata of the distributions installed in this venv. No network, well under a second.
"""

from __future__ import annotations

import ast
import json
import re
import sys
from functools import cache
from importlib import metadata
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[1]
BINDER = ROOT / "binder"
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
# The extras the notebooks' CPU cells need, and why.
NEEDED_EXTRAS = {
    "examples": "scikit-learn ships the digits data set that digits_mlp (00_tour, 05, 06, 07) trains on",
    "gpu": "cuda-core + nvidia-cuda-nvrtc compile the kernel with NVRTC on a CPU (00_tour, 05_cuda_codegen)",
}
# What repo2docker's own environment always has (the Jupyter server, the kernel, widgets).
REPO2DOCKER_PROVIDES = {"ipykernel", "ipython", "ipywidgets", "jupyterlab", "notebook", "jupyter-server"}
# Debian policy: lower case letters, digits, + - . ; at least two characters, starting alphanumeric.
DEBIAN_NAME = re.compile(r"[a-z0-9][a-z0-9+.-]+")
LOCAL_REF = re.compile(r"(?P<path>\.[^\[\s]*)(?:\[(?P<extras>[^\]]*)\])?")


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _lines(path: Path) -> list[str]:
    """Non-empty lines without comments (pip and repo2docker both treat `#` to the end as a comment)."""
    out = []
    for raw in path.read_text().splitlines():
        line = re.sub(r"(^|\s)#.*$", "", raw).strip()
        if line:
            out.append(line)
    return out


@cache
def _requirements() -> tuple[list[str], list[Requirement], list[tuple[str, set[str]]]]:
    """(option lines, named requirements, local references as (path, extras)) of binder/requirements.txt."""
    options, named, local = [], [], []
    for line in _lines(BINDER / "requirements.txt"):
        if line.startswith("-"):
            options.append(line)
        elif line.startswith("."):
            m = LOCAL_REF.fullmatch(line)
            assert m, f"binder/requirements.txt: cannot read the local reference {line!r}; write it as .[extra,...]"
            local.append((m["path"], {canonicalize_name(e) for e in (m["extras"] or "").split(",") if e.strip()}))
        else:
            named.append(Requirement(line))
    return options, named, local


def _project_extras() -> set[str]:
    (_, extras), = _requirements()[2]
    return extras


def _evaluates(req: Requirement, extras: set[str]) -> bool:
    if req.marker is None:
        return True
    env = default_environment()
    return any(req.marker.evaluate({**env, "extra": e}) for e in (extras or {""}))


@cache
def _binder_distributions() -> frozenset[str]:
    """Canonical names of the distributions `pip install -r binder/requirements.txt` brings in: tkx's
    dependencies from pyproject.toml with the chosen extras, then everything below them (and below the named
    requirements) from the metadata installed here. A distribution missing here ends its branch."""
    project = _pyproject()["project"]
    extras = _project_extras()
    todo = [Requirement(r) for r in project["dependencies"]]
    for extra in extras:
        todo += [Requirement(r) for r in project["optional-dependencies"].get(extra, [])]
    todo += _requirements()[1]
    seen: set[str] = set()
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        if name in seen:
            continue
        seen.add(name)
        try:
            dist = metadata.distribution(req.name)
        except metadata.PackageNotFoundError:
            continue
        asked = {canonicalize_name(e) for e in req.extras}
        for sub in dist.requires or []:
            sub_req = Requirement(sub)
            if _evaluates(sub_req, asked):
                todo.append(sub_req)
    return frozenset(seen)


def _top_level_imports(tree: ast.AST) -> set[str]:
    mods = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            mods |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            mods.add(node.module.split(".")[0])
    return mods


def _notebook_imports() -> dict[str, set[str]]:
    """Top-level module -> notebooks importing it, from every code cell (IPython magics and shell lines skipped)."""
    found: dict[str, set[str]] = {}
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        for cell in json.loads(path.read_text())["cells"]:
            if cell["cell_type"] != "code":
                continue
            source = "".join(cell["source"])
            if source.lstrip().startswith("%%"):
                continue  # a cell magic: not Python
            code = "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines())
            try:
                tree = ast.parse(code)
            except SyntaxError as exc:
                pytest.fail(f"{path.name}: a code cell does not parse ({exc}); fix the cell")
            for mod in _top_level_imports(tree):
                found.setdefault(mod, set()).add(path.name)
    return found


def _unprovided(modules: dict[str, set[str]]) -> list[str]:
    """Modules that neither the standard library, tkx nor a Binder distribution provides, with who imports them."""
    installed = _binder_distributions() | REPO2DOCKER_PROVIDES
    providers = metadata.packages_distributions()
    missing = []
    for mod, where in sorted(modules.items()):
        if mod in sys.stdlib_module_names or mod == "tkx":
            continue
        dists = {canonicalize_name(d) for d in providers.get(mod, [])}
        if not dists:
            missing.append(f"{mod} (imported by {', '.join(sorted(where))}; not installed in this venv either)")
        elif not dists & installed:
            missing.append(f"{mod} (from {'/'.join(sorted(dists))}; imported by {', '.join(sorted(where))})")
    return missing


# ------------------------------------------------------------------------------------------------------------
def test_requirements_install_the_project_with_the_extras_the_notebooks_need():
    _, _, local = _requirements()
    assert len(local) == 1, ("binder/requirements.txt must install this repository exactly once, as a line "
                             f"`.[{','.join(sorted(NEEDED_EXTRAS))}]`; found local references {local}")
    (path, extras), = local
    assert path == ".", (f"binder/requirements.txt installs {path!r}: pip resolves it from its working directory, "
                         "which repo2docker sets to the repository root, so the project is `.`")
    declared = {canonicalize_name(e) for e in _pyproject()["project"]["optional-dependencies"]}
    unknown = extras - declared
    assert not unknown, f"binder/requirements.txt asks for extras {sorted(unknown)} that pyproject.toml lacks"
    for extra, why in NEEDED_EXTRAS.items():
        assert extra in declared, f"pyproject.toml has no `{extra}` extra any more: update NEEDED_EXTRAS ({why})"
        assert extra in extras, f"binder/requirements.txt: add the `{extra}` extra to `.[...]`: {why}"


def test_torch_comes_from_the_cpu_index_at_the_makefiles_cpu_release():
    options, named, _ = _requirements()
    index_lines = [o for o in options if o.split("=", 1)[0].split()[0] in ("--extra-index-url", "--index-url")]
    assert any(o.split("=", 1)[-1].split()[-1].rstrip("/") == CPU_INDEX for o in index_lines), \
        f"binder/requirements.txt: add `--extra-index-url {CPU_INDEX}` so pip takes the CPU build of torch"
    torches = [r for r in named if canonicalize_name(r.name) == "torch"]
    assert len(torches) == 1, "binder/requirements.txt: name torch once, pinned to the Makefile's CPU release"
    (torch,) = torches
    pins = [s.version for s in torch.specifier if s.operator == "=="]
    assert len(pins) == 1 and "+" not in pins[0], \
        f"binder/requirements.txt: pin torch as `torch==X.Y.Z` (no +cpu: the index decides), not {torch}"
    pin = Version(pins[0])
    makefile = re.search(r"pip install 'torch==([0-9.]+)'", (ROOT / "Makefile").read_text())
    assert makefile, "the Makefile no longer installs a pinned CPU torch: update this test and binder/requirements.txt"
    assert pin == Version(makefile[1]), (f"binder/requirements.txt pins torch {pin} but the Makefile installs "
                                         f"{makefile[1]} on CPU machines: pin the same release in both")
    wanted = [Requirement(r) for r in _pyproject()["project"]["dependencies"] if Requirement(r).name == "torch"]
    for req in wanted:
        assert pin in req.specifier, f"binder/requirements.txt pins torch {pin}, outside pyproject's {req}"


def test_apt_txt_names_plain_debian_packages_including_graphviz():
    packages = _lines(BINDER / "apt.txt")
    for name in packages:
        assert DEBIAN_NAME.fullmatch(name), (f"binder/apt.txt: {name!r} is not a plain Debian package name (one "
                                             "name a line, lower case, no version or option)")
    assert "graphviz" in packages, "binder/apt.txt: add `graphviz` (its `dot` draws tkx's graphs; pip cannot)"


def test_runtime_txt_names_a_python_that_pyproject_allows():
    runtime = BINDER / "runtime.txt"
    if not runtime.exists():
        pytest.skip("no binder/runtime.txt: repo2docker uses its default Python")
    text = runtime.read_text().strip()
    m = re.fullmatch(r"python-(3\.\d+)", text)
    assert m, f"binder/runtime.txt holds {text!r}; write `python-3.N` (repo2docker's form, major.minor only)"
    allowed = SpecifierSet(_pyproject()["project"]["requires-python"])
    assert Version(m[1]) in allowed, (f"binder/runtime.txt asks for Python {m[1]} but pyproject.toml's "
                                      f"requires-python is {allowed}: change one of them")


def test_every_module_the_notebooks_import_is_installed_on_binder():
    imports = _notebook_imports()
    assert "tkx" in imports, "no notebook imports tkx: has notebooks/ moved?"
    missing = _unprovided(imports)
    assert not missing, ("the Binder environment lacks what the notebooks import; add the distribution to "
                         "pyproject.toml's dependencies or an extra named in binder/requirements.txt: "
                         + "; ".join(missing))


def test_every_module_tkx_imports_is_installed_on_binder():
    """tkx's own imports, lazy ones included (scikit-learn, cuda.core), resolve in the Binder environment."""
    imports: dict[str, set[str]] = {}
    for path in sorted((ROOT / "tkx").rglob("*.py")):
        for mod in _top_level_imports(ast.parse(path.read_text())):
            imports.setdefault(mod, set()).add(str(path.relative_to(ROOT)))
    missing = _unprovided(imports)
    assert not missing, ("the Binder environment lacks what tkx imports; add the distribution to pyproject.toml "
                         "or name its extra in binder/requirements.txt: " + "; ".join(missing))


def test_readme_binder_badge_comes_from_the_one_setting():
    """The badge is built from pyproject's [project.urls] Repository (scripts/binder-badge.py), or absent."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("binder_badge", ROOT / "scripts" / "binder-badge.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    text = (ROOT / "README.md").read_text()
    links = re.findall(r"https://mybinder\.org/v2/gh/[^)\s]+", text)
    assert "OWNER/REPO" not in text, "README.md: no placeholder badge; see scripts/binder-badge.py"
    found = mod.repository()
    if found is None:
        assert links == [], "README.md has a Binder link but pyproject.toml names no repository"
    else:
        assert mod.badge(*found) in text, "README.md: paste the line `python scripts/binder-badge.py` prints"
    badge = mod.badge("someone", "tkx")
    m = re.search(r"https://mybinder\.org/v2/gh/[^/]+/[^/]+/[^/?]+\?urlpath=lab/tree/(?P<path>[^&#)]+)", badge)
    assert m and (ROOT / m["path"]).is_file() and m["path"] == "notebooks/00_tour.ipynb"


def test_jupyterlab_news_is_off_in_binder_and_the_venv():
    """binder/overrides.json switches JupyterLab's news pop-up and update check off; make venv and
    repo2docker's postBuild both install it as the environment's settings overrides."""
    import json

    settings = json.loads((BINDER / "overrides.json").read_text())["@jupyterlab/apputils-extension:notification"]
    assert settings["fetchNews"] == "false" and settings["checkForUpdates"] is False
    target = "share/jupyter/lab/settings/overrides.json"
    assert f"cp binder/overrides.json $(VENV)/{target}" in (ROOT / "Makefile").read_text()
    post = BINDER / "postBuild"
    assert target in post.read_text() and post.stat().st_mode & 0o111, "binder/postBuild must be executable"
