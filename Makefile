# Two commands for a newcomer: `make demo` (set up + run the course on the tiny preset), `make test`.
# Contributors: `make check` (lint + the fast tier, about 3 min) before every commit.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# torch first, pinned, so nothing pulls another build; a local wheel folder is used when the machine has one.
TORCH  ?= torch==2.13.0
PIP    := $(BIN)/python -m pip install -q --disable-pip-version-check $(if $(wildcard /opt/wheels),--find-links /opt/wheels)
STAMP  := $(VENV)/.mimo-kit-installed
# the suite runs on parallel workers (pytest-xdist), longest tests first (tests/conftest.py)
WORKERS ?= 2
PYTEST := $(BIN)/python -m pytest -q -n $(WORKERS) --dist loadgroup --no-loadscope-reorder
FAST   := not slow and not notebook and not distributed and not browser and not gpu

.PHONY: setup demo test test-kernels check suite-table lab notebooks slides results lint bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) --upgrade pip setuptools wheel 2>&1 | grep -v "is ignored" || true
	$(PIP) "$(TORCH)" 2>&1 | grep -v "is ignored" || true
	$(BIN)/python -c "import torch" 
	$(PIP) -e ".[dev,ray]" "$(TORCH)" 2>&1 | grep -v "is ignored" || true
	$(BIN)/python -c "import mimo_kit, transformers, trl, peft, nbclient, pytest"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/mimo-kit course --out runs/course

test: $(STAMP)
	$(PYTEST)

# the fast tier and every test that asserts on the outcome of training or sampling (marker `outcome`), under another
# set of torch's CPU kernels (ATEN_CPU_CAPABILITY: default, avx2, avx512): CI's second pass, so a test that holds on
# one kernel set only fails there (docs/contributing.md); inductor's C++ cache apart, since its key does not hold the
# kernel set
KERNELS ?= default
test-kernels: $(STAMP)
	ATEN_CPU_CAPABILITY=$(KERNELS) TORCHINDUCTOR_CACHE_DIR=$${TMPDIR:-/tmp}/torchinductor-kit-$(KERNELS) \
		$(PYTEST) -m "($(FAST)) or outcome"

# lint, imports, every fast unit and property test, a smoke per subsystem: the tests without a slow marker; also the
# package's doctests that run in seconds, and that a notebook's kernel (it starts in notebooks/) imports this folder's
# copy of the kit, not another one installed in the environment. The student edition (`mimo-kit course --student`)
# has no tests/: there the check is the lint of what it holds, the doctests and the kernel's import.
LINTED    := $(wildcard mimo_kit tests notebooks benchmarks)
DOCTESTED := mimo_kit/exercises.py mimo_kit/config/__init__.py mimo_kit/model/__init__.py \
             mimo_kit/harness/__init__.py mimo_kit/rl/__init__.py
# run in notebooks/ (python code of its own: the copy it checks may be any other one)
KIT_HERE  := import mimo_kit, pathlib, sys; kit = pathlib.Path(mimo_kit.__file__).resolve().parent; \
             here = pathlib.Path("../mimo_kit").resolve(); print(f"a notebook here imports mimo_kit from {kit}"); \
             sys.exit(0 if kit == here else f"not {here}: this Python ({sys.prefix}) has another copy of the "\
                      "kit installed; make setup installs the copy here into the .venv here")
check: $(STAMP)
	$(BIN)/ruff check $(LINTED)
	cd notebooks && $(abspath $(BIN))/python -c '$(KIT_HERE)'
	$(BIN)/python -m pytest -q -p no:cacheprovider --doctest-modules $(DOCTESTED)
ifneq ($(wildcard tests),)
	$(PYTEST) -m "$(FAST)"
else
	@echo "no tests/ here (the student edition): the lint, the doctests and the kernel's import are its check"
endif

# the whole suite with each test's seconds → benchmarks/RESULTS_suite.md and suite_durations.json; inductor's
# cache starts empty, as on a fresh CI machine (a warm one hides the compiled-decode test's compile time)
suite-table: $(STAMP)
	mkdir -p runs/suite
	start=$$(date +%s); TORCHINDUCTOR_CACHE_DIR=$$(mktemp -d) $(PYTEST) --durations-json=runs/suite/durations.json; status=$$?; \
	  $(BIN)/python benchmarks/suite_table.py runs/suite/durations.json --wall test=$$(( $$(date +%s) - start )); \
	  exit $$status

lab: $(STAMP)
	$(BIN)/jupyter lab notebooks/

notebooks: $(STAMP)
	$(BIN)/mimo-kit notebooks

# one lecture deck per chapter (offline), from the committed notebooks as they are → runs/slides/<stem>.slides.html
slides: $(STAMP)
	$(BIN)/mimo-kit slides --out runs/slides

# committed result files under data/ come only from here: the newest finished run of each publishing experiment
results: $(STAMP)
	$(BIN)/mimo-kit results

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_decoder.py
	$(BIN)/python benchmarks/bench_optim.py
	$(BIN)/python benchmarks/bench_grading.py
	$(BIN)/python benchmarks/bench_spec.py
	$(BIN)/python benchmarks/bench_rl.py
	$(BIN)/python benchmarks/bench_rollout.py
	$(BIN)/python benchmarks/bench_service.py
	$(BIN)/python benchmarks/bench_async.py
	$(BIN)/python benchmarks/bench_plan.py

lint: $(STAMP)
	$(BIN)/ruff check mimo_kit tests notebooks benchmarks

clean:
	rm -rf runs .pytest_cache
