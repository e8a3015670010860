# Each target sets up what it needs: a fresh clone runs `make demo` or `make test` directly.
PYTHON ?= python3
VENV ?= .venv
# The pinned torch: on these machines pip takes the local CPU wheel; on a GPU machine the
# same pin resolves to the CUDA build from the default package index. Override freely,
# e.g. make TORCH_SPEC="torch==2.13.0+cu128 --extra-index-url <your torch index>".
TORCH_SPEC ?= torch==2.13.0
BIN := $(VENV)/bin
# The RLlib engine's environment (extra "distributed"): a venv of its own, because ray[rllib]
# pins an older gymnasium than the base install takes (see README, "Scale-out training").
DVENV ?= .venv-distributed
DBIN := $(DVENV)/bin
comma := ,

.PHONY: install install-distributed demo test test-distributed bench clean

install: $(VENV)/.installed

# A venv with the pinned torch, then the project with extras: $(call make_venv,FOLDER,EXTRAS).
define make_venv
	$(PYTHON) -m venv $(1)
	$(1)/bin/pip install -q --upgrade pip
	$(1)/bin/pip install -q $(TORCH_SPEC)
	$(1)/bin/pip install -q -e ".[$(2)]"
	touch $(1)/.installed
endef

$(VENV)/.installed: pyproject.toml
	$(call make_venv,$(VENV),dev)

install-distributed: $(DVENV)/.installed

$(DVENV)/.installed: pyproject.toml
	$(call make_venv,$(DVENV),dev$(comma)distributed)

demo: install
	$(BIN)/rlsched gpus
	$(BIN)/rlsched layouts --gpu a100-40gb --maximal
	$(BIN)/rlsched validate-layout --gpu a100-40gb 3g.20gb@0,2g.10gb@4,1g.5gb@6
	$(BIN)/rlsched simulate --scenario default --duration-s 600
	$(BIN)/rlsched eval --scenario default --policies ppo,all --episodes 1 --seed 0 --json demo-eval.json --plot demo-eval.png
	@echo "plot of each policy's layout timeline and Goodput: demo-eval.png"

# worksteal: idle workers take queued tests from busy ones (8.5 -> 6 minutes on 2 cores, stop 56)
test: install
	$(BIN)/python -m pytest -q -n auto --dist worksteal

# The tiny RLlib training run (marked rllib) and the engine-independent tests, with ray installed.
test-distributed: install-distributed
	$(DBIN)/python -m pytest -q -m rllib tests/test_rllib.py

bench: install
	$(BIN)/python -m pytest -q -m slow

clean:
	rm -rf $(VENV) $(DVENV) build *.egg-info
