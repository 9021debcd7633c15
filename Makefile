# The two commands a newcomer needs: `make run` and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
CONFIG ?= config/default.toml
ARGS   ?=

.PHONY: install run test bench clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

run: install
	exec $(BIN)/inferd serve --config $(CONFIG) $(ARGS)

test: install
	$(BIN)/pytest -q

clean:
	rm -rf $(VENV) *.egg-info
