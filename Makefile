# make tour  - build the virtual environment (first run only) and walk an example through tkx
# make test  - build the virtual environment (first run only) and run the CPU test suite
# make lint  - ruff
#
# The browser test (tests/test_browser.py) drives Debian's chromium through Playwright for Python:
# as root with apt-get, `make venv` installs the chromium package when /usr/bin/chromium is missing
# (about 30 s here); otherwise that test skips. `playwright install` (a browser download) is never run.
# The JupyterLab test (tests/test_jupyterlab.py) also needs the `lab` extra (jupyterlab, about 11 s
# to install here), which `make venv` installs; it skips without jupyterlab or chromium.

VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.make-stamp

.PHONY: venv tour test lint docs student-notebooks

venv: $(STAMP)

# Rebuilt when pyproject.toml changes. Without a GPU, torch==2.13.0 goes in first: pip finds the CPU
# wheel of that release on these machines' disk, where an unpinned torch would pull a CUDA build of
# several GB. With a GPU (nvidia-smi present) pip picks torch itself.
$(STAMP): pyproject.toml
	@test -x $(PY) || python3 -m venv $(VENV)
	@if ! command -v nvidia-smi >/dev/null 2>&1; then \
		echo "no GPU found: installing the CPU build of torch 2.13.0"; \
		$(PY) -m pip install 'torch==2.13.0'; \
	fi
	$(PY) -m pip install -e '.[gpu,examples,dev,lab]'
	@if ! command -v dot >/dev/null 2>&1; then \
		if command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
			echo "installing graphviz (the dot binary) with apt-get"; \
			export DEBIAN_FRONTEND=noninteractive; \
			apt-get install -y -q graphviz >/dev/null 2>&1 \
			|| { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q graphviz >/dev/null 2>&1; } \
			|| echo "note: could not install graphviz; graphs will show as text and DOT source"; \
		else \
			echo "note: graphviz's dot is not installed; graphs will show as text and DOT source"; \
		fi; \
	fi
	@if [ ! -x /usr/bin/chromium ]; then \
		if command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
			echo "installing Debian's chromium for the browser test (about 30 s)"; \
			export DEBIAN_FRONTEND=noninteractive; \
			apt-get install -y -q chromium >/dev/null 2>&1 \
			|| { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q chromium >/dev/null 2>&1; } \
			|| echo "note: could not install chromium; the browser test will skip"; \
		else \
			echo "note: /usr/bin/chromium is missing; the browser test will skip"; \
		fi; \
	fi
	@touch $(STAMP)

tour: venv
	$(VENV)/bin/tkx tour

# The notebooks run through nbval in a kernel of this venv: the tutorials with --nbval (stored text
# outputs compared after notebooks/sanitize.cfg), the benchmark notebook, whose numbers depend on the
# machine, with --nbval-lax (cells must run; outputs are not compared). GPU cells are tagged nbval-skip.
# scripts/store-notebook-outputs.py re-stores the compared outputs after a deliberate change.
LAX_NOTEBOOKS := notebooks/06_run_and_benchmark.ipynb
test: venv
	$(PY) -m pytest -q -p no:cacheprovider $(LAX_NOTEBOOKS) --nbval-lax --nbval-current-env
	$(PY) -m pytest -q -m "not gpu" tests notebooks --nbval --nbval-current-env \
		--nbval-sanitize-with notebooks/sanitize.cfg $(foreach nb,$(LAX_NOTEBOOKS),--ignore=$(nb))

# The documentation site (Sphinx + myst-nb, offline): executes the CPU notebooks, warnings are errors.
docs: venv
	cd docs && ../$(PY) -m sphinx -b html -W --keep-going -q . _build/html
	@echo "docs: open docs/_build/html/index.html"

# The notebooks with every exercise's solution cleared (nbgrader's markers), for a class.
student-notebooks: venv
	$(PY) scripts/student-notebooks.py build/student-notebooks

lint: venv
	$(VENV)/bin/ruff check .
