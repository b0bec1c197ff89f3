# The two set-up commands: `make demo` and `make test`. Both install what they need.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
PYTEST_ARGS ?=

.PHONY: install system-deps build lint test test-fast demo bench gpu-check proto clean

system-deps:
	bash scripts/install_system_deps.sh

$(VENV)/bin/python:
	python3 -m venv $(VENV)

# torch is pinned here (a CPU wheel on these machines); pyproject declares a range.
$(VENV)/.toolchain: | $(VENV)/bin/python
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==2.13.0 "scikit-build-core>=0.10" "nanobind>=2.4"
	touch $@

# Always re-run: scikit-build-core's build dir makes it incremental.
build: $(VENV)/.toolchain
	$(PIP) install -q --no-build-isolation -e ".[all,test]"

install: system-deps build

lint: build
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy
	$(VENV)/bin/lint-imports

test: install lint
	$(PY) -m pytest $(PYTEST_ARGS)

test-fast: build
	$(PY) -m pytest -m "not slow and not e2e and not browser and not postgres" $(PYTEST_ARGS)

demo: install
	PY=$(PY) bash scripts/demo.sh

bench: build
	$(PY) bench/store_bench.py

gpu-check:
	bash scripts/gpu_check.sh

clean:
	rm -rf build dist *.egg-info
