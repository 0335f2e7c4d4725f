# Two entry points: `make demo` (the pipeline on the embedded toy pair) and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The CPU build of torch; a GPU user installs the CUDA build of their choice first
# (`TORCH_SPEC=torch make venv` keeps whatever torch is already installed in .venv).
TORCH_SPEC ?= torch==2.13.0

.PHONY: venv demo test lint clean clean-cache

$(BIN)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH_SPEC)"
	$(BIN)/pip install -q -e ".[dev]"
	touch $@

venv: $(BIN)/.installed

# The pipeline on the embedded toy pair (built once into the user cache); every stage reuses
# or overwrites what earlier runs left in $(DEMO). On a 2-core CPU the stages after the toy pair's build (15-25 minutes, once)
# add up to about 15 minutes (collect 3, profile 1, two stopper trainings with their end-to-end
# checks 5, eval of 20 methods 5); override the sizes on the command line.
DEMO := data/runs/demo
DEMO_K := 1,1,1,1,1,1,1,1
DEMO_COLLECT := 160
DEMO_EVAL := 32
DEMO_TOKENS := 64
DEMO_STATIC := static:1,static:2,static:3,static:4,static:5,static:6,static:7,static:8,\
	mcsd:2,1,mcsd:4,2,mcsd:4,2,2,1
# The built-in adaptive stoppers join with the parameters `mcsd train` tuned on validation
# prompts (read from the LightGBM stopper's metrics.json when the eval starts).
DEMO_METHODS := ar,hf,$(DEMO_STATIC),mcsd-target-init:4,2,2,1,PEERS,\
	stopper:$(DEMO)/stoppers/lightgbm,stopper:$(DEMO)/stoppers/mlp,hf-assisted
MCSD := $(BIN)/mcsd

demo: venv
	$(MCSD) toy build --preset default
	$(MCSD) collect --target toy --prompts toy-code-collect --limit $(DEMO_COLLECT) \
		--k-config $(DEMO_K) --dense --max-new-tokens $(DEMO_TOKENS) \
		--out $(DEMO)/collect --threads 1
	$(MCSD) profile --target toy --out $(DEMO)/cost.json --max-tokens 16 --k-config $(DEMO_K) \
		--overhead-limit 8 --threads 1
	for model in lightgbm mlp; do \
		$(MCSD) train --data $(DEMO)/collect --model $$model --cost-profile $(DEMO)/cost.json \
			--val-frac 0.3 --out $(DEMO)/stoppers/$$model --threads 1 --check-prompts 12 \
			|| exit 1; \
	done
	peers=$$($(BIN)/python -c "import json; print(','.join(json.load(open( \
		'$(DEMO)/stoppers/lightgbm/metrics.json'))['peers'].values()))") && \
	$(MCSD) eval --target toy --prompts toy-code --limit $(DEMO_EVAL) --k-config $(DEMO_K) \
		--max-new-tokens $(DEMO_TOKENS) --methods "$(subst PEERS,$$peers,$(DEMO_METHODS))" \
		--out $(DEMO)

test: venv
	$(BIN)/python -m pytest

lint: venv
	$(BIN)/ruff check .

# `clean` removes the venv and every run; the toy pairs stay in the user cache, where every
# checkout finds them ($MCSD_CACHE, else $XDG_CACHE_HOME/mcsd, else ~/.cache/mcsd):
# `make clean-cache` removes them. data/models is where pairs were built before the cache.
MCSD_CACHE_DIR := $(or $(MCSD_CACHE),$(or $(XDG_CACHE_HOME),$(HOME)/.cache)/mcsd)

clean:
	rm -rf $(VENV) data/models data/runs data/stoppers data/reports data/cache

clean-cache:
	rm -rf $(MCSD_CACHE_DIR)/models
