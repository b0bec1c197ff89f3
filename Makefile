# The two set-up commands: `make demo` and `make test`. Both install what they need.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
PYTEST_ARGS ?=

.PHONY: install system-deps build lint test test-fast demo bench gpu-check proto lock clean

system-deps:
	bash scripts/install_system_deps.sh

$(VENV)/bin/python:
	python3 -m venv $(VENV)

# Every third-party package comes from the lock (pinned versions: a new release
# elsewhere cannot change what this installs); pyproject declares ranges. torch is
# locked to the CPU build. `make lock` re-resolves it, on purpose.
LOCK := requirements/lock.txt
$(VENV)/.toolchain: $(LOCK) | $(VENV)/bin/python
	$(PIP) install -q -r $(LOCK)
	touch $@

# Always re-run: scikit-build-core's build dir makes it incremental. --no-deps: the
# lock has installed every dependency already.
build: $(VENV)/.toolchain
	$(PIP) install -q --no-build-isolation --no-deps -e .
	$(PIP) check

# Re-resolve the lock from pyproject.toml and requirements/lock.in: pins that still
# fit are kept; `make lock LOCK_ARGS=--upgrade` moves every pin to the newest
# release within its range. Commit the result with whatever it regenerates.
LOCK_ARGS ?=
lock: $(VENV)/.toolchain
	$(VENV)/bin/pip-compile -q $(LOCK_ARGS) --extra all --extra test --strip-extras --unsafe-package recstore \
	  --no-emit-index-url --no-emit-find-links -o $(LOCK) pyproject.toml requirements/lock.in

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
