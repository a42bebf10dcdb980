# Everything a newcomer needs: `make demo` and `make test` set up .venv on first use.
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
STAMP   = $(VENV)/.installed-stamp
DEMO   ?= demo

.PHONY: demo test lint unit bench fuzz-deep clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	@mkdir -p $(DEMO)
	$(BIN)/kvsched simulate --out $(DEMO)/trace.jsonl
	$(BIN)/kvsched check $(DEMO)/trace.jsonl

lint: $(STAMP)
	$(BIN)/ruff check spec reference src tests proofs
	$(BIN)/mypy --strict -p kvsched
	$(BIN)/mypy --strict tests
	@# spec/ and reference/ stay standard-library Python (design.md section 1).
	$(BIN)/python tests/layout_rules.py

unit: $(STAMP)
	$(BIN)/python -m pytest -n 2 -p no:cacheprovider

test: lint unit

bench: $(STAMP)
	$(BIN)/python -m kvsched.bench --out docs/benchmarks.md

fuzz-deep: $(STAMP)
	HYPOTHESIS_PROFILE=deep $(BIN)/python -m pytest -p no:cacheprovider tests -k "property or stateful"

clean:
	rm -rf $(VENV) $(DEMO) build *.egg-info
