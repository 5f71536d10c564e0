# Two commands on a fresh machine: `make demo` and `make test` (both create .venv if missing).
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
OUT     ?= runs/demo

.PHONY: install demo test test-all bench lint clean

$(STAMP): pyproject.toml
	test -d $(VENV) || $(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

# Runs every registered recipe with --quick and prints where the reports are.
demo: $(STAMP)
	$(BIN)/vlctl reproduce all --quick --out $(OUT)

test: $(STAMP)
	$(BIN)/python -m pytest -q

test-all: $(STAMP)
	$(BIN)/python -m pytest -q -m ''

bench: $(STAMP)
	$(BIN)/python benchmarks/run.py
	$(BIN)/python benchmarks/index_bench.py --kinds flat ivfpq --json benchmarks/index_results.json

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks experiments

clean:
	rm -rf runs .pytest_cache
