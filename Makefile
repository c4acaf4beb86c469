# make tour  - build the virtual environment (first run only) and walk an example through tkx
# make test  - build the virtual environment (first run only) and run the CPU test suite
# make test-full - the same plus the option x arch matrix of the largest examples (marker `full`)
# make lint  - ruff
# make fuzz  - an hour of the differential fuzzer (scripts/fuzz-campaign), resumed where the last run stopped
#              (FUZZ_WORKERS=N: N worker processes; FUZZ_COUNT=10000: stop after that many programs)
#
# The browser test (tests/test_browser.py) drives Debian's chromium through Playwright for Python:
# as root with apt-get, `make venv` installs the chromium package when /usr/bin/chromium is missing
# (about 30 s here); otherwise that test skips. `playwright install` (a browser download) is never run.
# The JupyterLab test (tests/test_jupyterlab.py) also needs the `lab` extra (jupyterlab, about 11 s
# to install here), which `make venv` installs; it skips without jupyterlab or chromium.

VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.make-stamp
INCOMPLETE := $(VENV)/.make-incomplete

.PHONY: venv tour test test-full test-fast lab lint docs student-notebooks apt-package fuzz

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
	@# nbgrader is here for `make student-notebooks` only: its JupyterLab menus and "Create Assignment"
	@# side bar would greet every learner, so its Jupyter extensions are switched off in this venv.
	@$(VENV)/bin/jupyter labextension disable --level=sys_prefix @jupyter/nbgrader >/dev/null 2>&1 || true
	@for ext in formgrader validate_assignment assignment_list course_list; do \
		$(VENV)/bin/jupyter server extension disable --sys-prefix nbgrader.server_extensions.$$ext >/dev/null 2>&1 || true; \
	done
	@# JupyterLab's defaults for this venv (binder/overrides.json): no Jupyter news pop-up, no update check.
	@mkdir -p $(VENV)/share/jupyter/lab/settings && cp binder/overrides.json $(VENV)/share/jupyter/lab/settings/overrides.json
	@rm -f $(INCOMPLETE)
	@$(MAKE) --no-print-directory apt-package PKG=graphviz CHECK="command -v dot" WHY="graphs will show as text and DOT source"
	@$(MAKE) --no-print-directory apt-package PKG=chromium CHECK="test -x /usr/bin/chromium" WHY="the browser tests will skip"
	@if [ -e $(INCOMPLETE) ]; then \
		rm -f $(INCOMPLETE); \
		echo "set-up incomplete (see the apt-get error above): $(STAMP) not written, so the next make retries"; \
	else \
		touch $(STAMP); \
	fi

# One system package through apt-get, as root: apt-get's own output is shown when it fails, and a
# failure marks the set-up incomplete (no stamp, so the next `make` tries again). Without root or
# apt-get there is nothing to retry: a note says what is missing.
apt-package:
	@if ! sh -c '$(CHECK)' >/dev/null 2>&1; then \
		if command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
			echo "installing $(PKG) with apt-get"; \
			export DEBIAN_FRONTEND=noninteractive; \
			log=$$(mktemp); \
			if ! { apt-get install -y -q $(PKG) >$$log 2>&1 || { apt-get update -q >>$$log 2>&1 && apt-get install -y -q $(PKG) >>$$log 2>&1; }; }; then \
				echo "apt-get could not install $(PKG) ($(WHY)); its output:"; tail -n 25 $$log; \
				touch $(INCOMPLETE); \
			fi; \
			rm -f $$log; \
		else \
			echo "note: $(PKG) is missing and apt-get needs root here: $(WHY)"; \
		fi; \
	fi

tour: venv
	$(VENV)/bin/tkx tour

# The notebooks run through nbval in a kernel of this venv: the tutorials with --nbval (stored text
# outputs compared after notebooks/sanitize.cfg), the benchmark notebook, whose numbers depend on the
# machine, with --nbval-lax (cells must run; outputs are not compared). GPU cells are tagged nbval-skip.
# scripts/store-notebook-outputs.py re-stores the compared outputs after a deliberate change.
# `make test` leaves out the tests marked `full` (the option x arch matrix of the largest examples,
# minutes of NVRTC on 2 cores); `make test-full` runs them too.
LAX_NOTEBOOKS := notebooks/06_run_and_benchmark.ipynb
TEST_MARKS ?= not gpu and not full
test: venv
	$(PY) -m pytest -q -p no:cacheprovider $(LAX_NOTEBOOKS) --nbval-lax --nbval-current-env
	$(PY) -m pytest -q -m "$(TEST_MARKS)" tests notebooks --nbval --nbval-current-env \
		--nbval-sanitize-with notebooks/sanitize.cfg $(foreach nb,$(LAX_NOTEBOOKS),--ignore=$(nb))

test-full: venv
	$(MAKE) --no-print-directory test TEST_MARKS="not gpu"

# A quick check of every stage (aimed at < 3 minutes on 2 cores): capture and IR, passes, schedule, arena,
# CUDA source map and NVRTC, the views, the exported report, the CLI and the package structure, on every
# example but `medium` (its tests alone take minutes); no notebooks, no JupyterLab.
FAST_TESTS := tests/test_capture.py tests/test_passes.py tests/test_schedule.py tests/test_stale_stages.py \
	tests/test_render_stages.py tests/test_source_map.py tests/test_structure.py tests/test_words.py \
	tests/test_cli.py tests/test_errors.py
test-fast: venv
	$(PY) -m pytest -q -m "not gpu and not slow" -k "not medium" $(FAST_TESTS)

# JupyterLab on the notebooks (as root, Jupyter refuses to start without --allow-root: added here).
lab: venv
	$(VENV)/bin/jupyter lab notebooks/ $$([ "$$(id -u)" = 0 ] && echo --allow-root)

# The documentation site (Sphinx + myst-nb, offline): executes the CPU notebooks, warnings are errors.
docs: venv
	cd docs && ../$(PY) -m sphinx -j 2 -b html -W --keep-going -q . _build/html
	@echo "docs: open docs/_build/html/index.html"

# The notebooks with every exercise's solution cleared (nbgrader's markers), for a class.
student-notebooks: venv
	$(PY) scripts/student-notebooks.py build/student-notebooks

FUZZ_OUT ?= fuzz-out
FUZZ_SECONDS ?= 3600
FUZZ_WORKERS ?= 1
FUZZ_COUNT ?= 0
fuzz: venv
	PYTHONPATH=$(CURDIR) $(PY) scripts/fuzz-campaign --out $(FUZZ_OUT) --seconds $(FUZZ_SECONDS) --resume --quiet \
		--workers $(FUZZ_WORKERS) --count $(FUZZ_COUNT)

lint: venv
	$(VENV)/bin/ruff check .
