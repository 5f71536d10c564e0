# Two commands on a fresh machine: `make demo` and `make test` (both create .venv if missing).
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
OUT     ?= runs/demo

.PHONY: install demo reproduce test test-all bench lint clean

$(STAMP): pyproject.toml
	test -d $(VENV) || $(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

# Every recipe's --quick preset, from the shipped trained checkpoints: minutes on 2 CPU cores.
demo: $(STAMP)
	$(BIN)/vlctl reproduce all --quick --out $(OUT)

# The same, training every model first (the numbers the shipped checkpoints were measured with).
reproduce: $(STAMP)
	$(BIN)/vlctl reproduce all --quick --from-scratch --out runs/reproduce

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
