# Two entry points for a fresh machine (see README):
#   make demo   builds everything, trains the zoo models the first time, runs the demo
#   make test   builds everything and runs the test suite
# Everything lands in ./.venv; torch==2.14.1 is the CUDA 13.0 build (it also runs on CPU).

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip

.PHONY: deps build demo test bench cpu-only-check clean

$(VENV)/.deps-installed: requirements-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet -r requirements-dev.txt
	touch $@

deps: $(VENV)/.deps-installed

# Editable build: the extension lands in python/specdec_cuda/, where the tests import it.
build: deps
	$(PIP) install --no-build-isolation --no-deps -v -e .  # -v: shows the compile progress
	$(PY) -c "import specdec_cuda, json; print(json.dumps(specdec_cuda.build_info()))"

demo: build
	$(PY) -m specdec_cuda demo

test: build
	$(PY) -m pytest -q tests

bench: build
	$(PY) bench/run_all.py

# CPU-only build into a scratch copy, then the CPU tests against it (cheap proof that
# SPECDEC_CUDA=0 builds and passes).
cpu-only-check: deps
	bash scripts/cpu_only_check.sh $(PY)

clean:
	rm -rf build python/specdec_cuda/_C*.so python/specdec_cuda/_build_meta.py
