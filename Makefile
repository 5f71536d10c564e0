# Two commands on a fresh machine: `make demo` and `make test` (both run `make install` first: .venv, and WordNet / Chromium from apt).
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
OUT     ?= runs/demo

.PHONY: install demo reproduce test test-all bench bench-peers lint clean

# scripts/system-deps.sh: what pip cannot install (WordNet 3.0, Chromium) through apt when it may
# (root or passwordless sudo), else one line per missing part; it never fails the make.
$(STAMP): pyproject.toml scripts/system-deps.sh
	test -d $(VENV) || $(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet -e '.[dev,milvus]'
	@sh scripts/system-deps.sh $(BIN)/python
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

# vlctl beside the tools users would pick instead (issue 24), in a venv of their own: the peers
# pull in heavy dependencies (transformer-lens, nnsight, diffusers, wandb) that the project must not
# carry. torch, torchvision and numpy are held at the project's pins by the constraints file; vlctl
# itself comes from the working tree through PYTHONPATH=src, never installed there.
PEERS       := .venv-peers
PEERS_STAMP := $(PEERS)/.installed

$(PEERS_STAMP): benchmarks/peers-requirements.txt benchmarks/peers-constraints.txt
	test -d $(PEERS) || $(PY) -m venv $(PEERS)
	$(PEERS)/bin/pip install --quiet -r benchmarks/peers-requirements.txt -c benchmarks/peers-constraints.txt
	touch $(PEERS_STAMP)

bench: $(STAMP) $(PEERS_STAMP)
	$(BIN)/python benchmarks/run.py
	$(BIN)/python benchmarks/index_bench.py --kinds flat ivfpq --json benchmarks/index_results.json
	$(BIN)/python benchmarks/serve_load.py --demo-dir $(OUT) --json benchmarks/serve_load.json
	nice -n 10 $(BIN)/python benchmarks/milvus_bench.py --json benchmarks/milvus_bench.json
	PYTHONPATH=src $(PEERS)/bin/python benchmarks/peers.py

bench-peers: $(PEERS_STAMP)
	PYTHONPATH=src $(PEERS)/bin/python benchmarks/peers.py

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks experiments

clean:
	rm -rf runs .pytest_cache
