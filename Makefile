# Two commands on a fresh machine: `make demo` and `make test` (both run `make install` first: .venv, and WordNet / Chromium from apt).
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
OUT     ?= runs/demo

.PHONY: install demo reproduce test test-all bench bench-peers bench-scale bench-store bench-layout lint clean

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

# The scale rehearsal (issue 45): synthetic datasets in the upstream layouts at a tenth and the whole
# of the papers' sizes (REHEARSAL, about 6 GB), then every real recipe at both with the tiny random
# encoder: benchmarks/scale_rehearsal.json and the rates `vlctl reproduce --plan` reads (run it on a
# quiet machine: the rates are this machine's); then a SIGKILL in each recipe's longest stage, and
# at 0.3 of the sizes the plan's estimate checked against the run. About 70 min on 2 cores.
REHEARSAL ?= /tmp/vlctl-rehearsal
RUN_REHEARSAL = $(BIN)/python benchmarks/rehearsal/run.py --runs $(REHEARSAL)/runs
bench-scale: $(STAMP)
	for s in 0.1 1 0.3; do \
	  PYTHONPATH=src $(BIN)/python benchmarks/rehearsal/make_datasets.py --scale $$s --out $(REHEARSAL)/s$$s || exit 1; \
	done
	$(RUN_REHEARSAL) --datasets $(REHEARSAL)/s0.1 && $(RUN_REHEARSAL) --datasets $(REHEARSAL)/s1
	$(RUN_REHEARSAL) --datasets $(REHEARSAL)/s0.3 --check-plan --recipes controlembed-shotbench \
	  controlembed-stanford40 controlembed-clevr4 tevi-coco 3vl-coco
	$(RUN_REHEARSAL) --datasets $(REHEARSAL)/s0.1 --recipes controlembed-shotbench --kill fit --kill-after 5
	$(RUN_REHEARSAL) --datasets $(REHEARSAL)/s0.1 --recipes controlembed-stanford40 --kill fit --kill-after 5
	$(RUN_REHEARSAL) --datasets $(REHEARSAL)/s0.1 --recipes controlembed-clevr4 --kill fit --kill-after 5
	$(RUN_REHEARSAL) --datasets $(REHEARSAL)/s0.1 --recipes tevi-coco --kill embed-train --kill-after 10
	$(RUN_REHEARSAL) --datasets $(REHEARSAL)/s0.1 --recipes 3vl-coco --kill evaluate --kill-after 30

# The store at scale (issue 44): 100k-row adds to 10M rows, at nlist 1024 and at nlist 4096 (a 1M
# first add trains it): about 25 min and 22 GB of temporary disk, deleted after each; then float16
# against float32 on the same rows.
bench-store: $(STAMP)
	$(BIN)/python benchmarks/store_scale.py --rows 10000000 --json benchmarks/store_scale_10m_nlist1024.json
	$(BIN)/python benchmarks/store_scale.py --rows 10000000 --first-add 1000000 --nlist 4096 --measure-every 30 \
		--points 32:100,32:200,32:400,64:200,64:400 --json benchmarks/store_scale_10m.json
	PYTHONPATH=src $(BIN)/python benchmarks/float16_check.py --json benchmarks/float16_check.json

# embedding-reader and autofaiss read a vlctl store, vlctl opens a clip-retrieval folder: the
# field's readers in a venv of their own (autofaiss holds numpy < 2, hence pyarrow 18 there).
LAYOUT       := .venv-layout
LAYOUT_STAMP := $(LAYOUT)/.installed

$(LAYOUT_STAMP):
	test -d $(LAYOUT) || $(PY) -m venv $(LAYOUT)
	$(LAYOUT)/bin/pip install --quiet embedding-reader==1.8.1 autofaiss==2.18.0 faiss-cpu==1.15.1 pyarrow==18.1.0
	touch $(LAYOUT_STAMP)

bench-layout: $(STAMP) $(LAYOUT_STAMP)
	PYTHONPATH=src $(BIN)/python benchmarks/field_layout_check.py --er-python $(LAYOUT)/bin/python \
		--json benchmarks/field_layout_check.json

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks experiments

clean:
	rm -rf runs .pytest_cache
