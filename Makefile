# Set-up and everyday commands. Every target creates .venv and installs PyTorch and kattn first.
#   make demo                 the main job on its embedded default (kattn demo)
#   make test                 the whole test suite
#   make conformance          the public contract (tests/test_contract.py, ../shared/conformance)
#   make test TORCH=2.5.1     choose the PyTorch version (TORCH= for whatever pip picks)
PYTHON ?= python3
TORCH ?= 2.13.0
VENV ?= .venv
BIN := $(VENV)/bin
TORCH_SPEC := $(if $(TORCH),torch==$(TORCH),torch)
STAMP := $(VENV)/.installed-torch-$(or $(TORCH),any)

.PHONY: demo test conformance lint bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet "$(TORCH_SPEC)"
	$(BIN)/python -m pip install --quiet -e ".[dev,plot,data,train,text,translation,gpu,hf]"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/kattn demo

test: $(STAMP)
	$(BIN)/python -m pytest

# The project's own contract tests, then the shared conformance suite where ../shared has one.
conformance: $(STAMP)
	$(BIN)/python -m pytest tests/test_contract.py
	@if [ -d ../shared/conformance ]; then \
		$(BIN)/python -m pytest ../shared/conformance -q; \
	else \
		echo "conformance: ../shared/conformance is absent; ran tests/test_contract.py only"; \
	fi

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/python benchmarks/foundation_speed.py
	$(BIN)/python benchmarks/rpe_speed.py
	$(BIN)/python benchmarks/rpe_blocked_speed.py
	$(BIN)/python benchmarks/nystrom_speed.py
	$(BIN)/python benchmarks/learned_speed.py
	$(BIN)/python benchmarks/lm_speed.py

clean:
	rm -rf $(VENV) build src/*.egg-info
