# make run:  train the embedded default (creates .venv with the runtime dependencies)
# make test: create .venv with the test extra and run the whole test suite
# make demo: the CPU path: .venv with the demo extra (Triton, torch CPU, matplotlib), the tiny
#            profile on the interpret backend, then `inspect --plot` and `verify`
PYTHON ?= python3
PIP_ARGS ?=                     # passed to every pip install (e.g. an index of CPU-only torch wheels)
# pytest-xdist workers of `make test`, each taking whole test files (a file's fixtures run once);
# two: CI's cores (a fresh clone's pytest here: 12 min 18 s on one, 8 min 14 s on two; docs/performance/ci.md)
TEST_WORKERS ?= 2
VENV := .venv
BIN := $(VENV)/bin
DEMO := coppelius-demo
DEMO_RESULT := $(DEMO)/tiny-result-c0.bin
DEMO_PLOT := $(DEMO)/tiny.png
# cuda-bindings of the driver's CUDA major (README: 12.x for a CUDA 12 driver, 13.x for CUDA 13):
# the major from libcuda's cuDriverGetVersion (through ctypes: no bindings needed yet), else from
# nvidia-smi's header; none found (no driver), pip picks as pyproject.toml allows
CUDA_MAJOR ?= $(shell $(PYTHON) -c "import ctypes; v = ctypes.c_int(); \
	ctypes.CDLL('libcuda.so.1').cuDriverGetVersion(ctypes.byref(v)); print(v.value // 1000)" \
	2>/dev/null || nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9][0-9]*\)\..*/\1/p' | head -n 1)
BINDINGS_12 := cuda-bindings>=12.9.1,<13
BINDINGS_13 := cuda-bindings>=13.0.0,<14
BINDINGS = $(BINDINGS_$(strip $(CUDA_MAJOR)))

.PHONY: run test test-cpu-matrix demo clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.runtime: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q $(PIP_ARGS) -e . $(if $(BINDINGS),'$(BINDINGS)')
	touch $@

$(VENV)/.demo: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q $(PIP_ARGS) -e '.[demo]'
	touch $@ $(VENV)/.runtime

$(VENV)/.dev: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q $(PIP_ARGS) -e '.[dev]'
	touch $@ $(VENV)/.runtime $(VENV)/.demo

run: $(VENV)/.runtime
	$(BIN)/coppelius run $(ARGS)

test: $(VENV)/.dev
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile -m 'not cpu_matrix' $(PYTEST_ARGS)

# the tiny golden run under every OpenBLAS family, thread count and numpy dispatch level this CPU
# can emulate (tests/host/run/test_cpu_independence.py; ~3 min a family on 2 cores): CI runs it
# after `make test`, whose golden checks run the matrix's two ends
test-cpu-matrix: $(VENV)/.dev
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) -m cpu_matrix $(PYTEST_ARGS) \
		tests/host/run/test_cpu_independence.py

# a fresh start every time (an empty checkpoint file); the tiny stream stays cached in $(DEMO)/
demo: $(VENV)/.demo
	mkdir -p $(DEMO)
	: > $(DEMO)/tiny.ckpt
	$(BIN)/coppelius run --profile tiny --backend interpret --directory $(DEMO) --overwrite
	$(BIN)/coppelius inspect $(DEMO_RESULT) --plot $(DEMO_PLOT)
	$(BIN)/coppelius verify $(DEMO_RESULT) --directory $(DEMO) --steps 2
	@echo "demo plot: $(abspath $(DEMO_PLOT))"

clean:
	rm -rf $(VENV) build *.egg-info
