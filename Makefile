# Two entry points: `make demo` (the pipeline on the embedded toy pair) and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The CPU build of torch; a GPU user installs the CUDA build of their choice first
# (`TORCH_SPEC=torch make venv` keeps whatever torch is already installed in .venv).
TORCH_SPEC ?= torch==2.13.0

.PHONY: venv demo test lint clean

$(BIN)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH_SPEC)"
	$(BIN)/pip install -q -e ".[dev]"
	touch $@

venv: $(BIN)/.installed

# The pipeline on the embedded toy pair; each stage reuses what earlier runs left in data/.
DEMO := data/runs/demo
demo: venv
	$(BIN)/mcsd toy build --preset default
	mkdir -p $(DEMO)
	$(BIN)/mcsd bench --target toy --prompts toy-code --limit 12 --max-new-tokens 128 \
		--json $(DEMO)/bench.json

test: venv
	$(BIN)/python -m pytest

lint: venv
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) data/models data/runs data/stoppers data/reports data/cache
