# Each target installs what it needs first (a virtual environment in .venv that reuses an
# already-installed torch when the system has one), so `make test` and `make train` work on a fresh clone.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
ENV    ?= pong_v3
ARGS   ?=

.PHONY: install test test-slow train bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv --system-site-packages $(VENV)
	$(BIN)/python -m pip install -q -e ".[test]"
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(BIN)/python -m pytest

test-slow: $(STAMP)
	$(BIN)/python -m pytest -m slow

bench: $(STAMP)
	$(BIN)/madqn bench --quick $(ARGS)

train: $(STAMP)
	$(BIN)/madqn train --env $(ENV) $(ARGS)

clean:
	rm -rf $(VENV) build *.egg-info
