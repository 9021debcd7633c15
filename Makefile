# The two commands a newcomer needs: `make run` and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
CONFIG ?= config/default.toml
ARGS   ?=

.PHONY: install run test bench bench-quick clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test,bench,torch]'
	touch $(STAMP)

run: install
	exec $(BIN)/inferd serve --config $(CONFIG) $(ARGS)

test: install
	$(BIN)/pytest -q

# The benchmark scenarios (benchmarks/scenarios/), results in benchmarks/results/. Needs wrk.
bench: install
	cd benchmarks/scenarios && for s in s*_*.py; do ../../$(BIN)/python $$s || exit 1; done

bench-quick: install
	cd benchmarks/scenarios && for s in s1_seed.py s2_overhead.py; do ../../$(BIN)/python $$s --quick --out-dir /tmp/inferd-bench-quick || exit 1; done

clean:
	rm -rf $(VENV) *.egg-info
