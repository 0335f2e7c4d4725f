"""The learned prompt-lookup copy length: match statistics, the decision rule, training, the
decoder taking exactly the decisions its replay takes (features included; beside a draft, the
draft's teacher-forced candidates too), greedy output equal to the target's alone and in
batches, the hindsight oracle, and `mcsd train --decision copy`."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from collect.outputs import Trace, draft_hits, drafted_traces, target_traces
from mcsd_runtime.cli import main
from mcsd_runtime.decisions.copy_length import FEATURES, CopyLength
from mcsd_runtime.decode.decoder import ARDecoder, DecodeConfig, MCSDDecoder
from mcsd_runtime.errors import MCSDError
from mcsd_runtime.evaluate.methods import check_method, short_name
from mcsd_runtime.lookup import find_match
from mcsd_runtime.pricing.profile import CostProfile
from replay.copy import Replay, copy_all, never, step_costs
from train.copy.fit import fit

REPEATING = [5, 6, 7, 8, 9, 10, 5, 6, 7, 8, 9, 10, 5, 6, 7]
PROMPTS = [REPEATING, [1, 2, 3, 4, 1, 2, 3], [3, 3, 3, 3, 3], [9, 8, 7, 9, 8], [4, 5, 4, 5, 4]]
COSTS = [1.0 + 0.05 * k for k in range(9)]  # a step copying k tokens, k = 0..8


def test_find_match_reports_where_and_how_often_the_suffix_occurred():
    ctx = [1, 2, 3, 9, 1, 2, 3, 7, 8, 4, 2, 3]
    m = find_match(ctx, 3, 1, 4)
    assert (m.tokens, m.ngram, m.start, m.hits) == ([7, 8, 4], 2, 7, 2)
    assert m.agree == 0.5 and m.distance(len(ctx)) == 5  # [2, 3] was followed by 9, then 7
    assert find_match(ctx, 3, 3, 4) is None


class Constant:
    """A booster predicting the same survival at every length."""

    def __init__(self, p: float) -> None:
        self.p = p

    def predict(self, x: np.ndarray) -> np.ndarray:
        assert x.shape[1] == len(FEATURES)
        return np.full(x.shape[0], self.p)


def test_choose_copies_while_a_token_pays_for_its_verification():
    match = find_match(REPEATING, 8, 1, 4)
    feats = [0.0] * (len(FEATURES) - 1)
    # each copied token costs 0.05 s more; at 1 token/s it pays when it survives above 0.05
    assert CopyLength(Constant(0.9), COSTS, rate=1.0).choose(match, feats) == len(match.tokens)
    assert CopyLength(Constant(0.04), COSTS, rate=1.0).choose(match, feats) == 0
    # ...and at 30 tokens/s only above 1.5: never
    assert CopyLength(Constant(0.9), COSTS, rate=30.0).choose(match, feats) == 0


class ByConfidence:
    """Survival from the target's confidence and the length: decisions that depend on every
    step's features, so that decoder and replay agree only if their features do."""

    def __init__(self) -> None:
        self.seen: list[list[float]] = []

    def predict(self, x: np.ndarray) -> np.ndarray:
        self.seen.append(x[0, :-1].tolist())
        conf = x[:, FEATURES.index("conf_last")]
        return np.clip(conf, 0, 1) * 0.97 ** x[:, -1]


@pytest.fixture(scope="module")
def reference(pair):
    ar = ARDecoder(pair, DecodeConfig(max_new_tokens=40))
    return [ar.generate(p).token_ids for p in PROMPTS]


def decoder(pair, policy: CopyLength, max_new_tokens: int = 40) -> MCSDDecoder:
    k = policy.max_copy
    cfg = DecodeConfig(k_config=(1,) * k, max_new_tokens=max_new_tokens, lookup=k,
                       lookup_min_ngram=policy.min_ngram)
    return MCSDDecoder(pair, cfg, "none", copy_length=policy)


def test_the_decoder_decides_as_its_replay_does(pair):
    traces = target_traces(pair, PROMPTS, 30)
    for trace in traces:
        live, replayed = ByConfidence(), ByConfidence()
        out = decoder(pair, CopyLength(live, COSTS, rate=0.6), 30).generate(trace.prompt)
        assert out.token_ids == trace.tokens
        Replay(trace, 8, 1, 4).walk(CopyLength(replayed, COSTS, rate=0.6).choose, COSTS)
        assert np.allclose(live.seen, replayed.seen, atol=1e-5)
    assert any(s[FEATURES.index("last_copied")] > 0 for s in live.seen)


DRAFT_COSTS = [1.4, 1.5, 1.6, 1.7, 1.8]  # a drafted step, by the draft's pending tokens


@pytest.fixture(scope="module")
def feature_pair():
    """A pair whose draft reads the target's states (`distill.feature`)."""
    import torch

    from conftest import make_pair
    from mcsd_runtime.backend.layers import cut_draft
    from mcsd_runtime.distill.feature import with_feature_input
    from mcsd_runtime.models.pair import Pair

    base = make_pair(vocab=64, seed=3)
    draft = with_feature_input(cut_draft(base.target, [0, 1])).to(torch.float64)
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    return Pair(base.target, draft.eval())


def beside_draft(pair, policy: CopyLength, max_new_tokens: int = 30) -> MCSDDecoder:
    cfg = DecodeConfig(k_config=(3, 2, 1), max_new_tokens=max_new_tokens, lookup=policy.max_copy,
                       lookup_min_ngram=policy.min_ngram)
    return MCSDDecoder(pair, cfg, "static:1", copy_length=policy)


@pytest.mark.parametrize("kind", ["draft", "feature draft"])
def test_beside_a_draft_the_decoder_copies_or_drafts_as_its_replay_does(pair, feature_pair,
                                                                        kind):
    p = pair if kind == "draft" else feature_pair
    traces = draft_hits(p, target_traces(p, PROMPTS, 30), width=3)
    copies = 0
    for trace in traces:
        live, replayed = ByConfidence(), ByConfidence()
        policy = CopyLength(live, COSTS, 0.6, draft_costs=DRAFT_COSTS, draft_prior=1.5)
        out = beside_draft(p, policy).generate(trace.prompt)
        assert out.token_ids == trace.tokens
        walked = Replay(trace, 8, 1, 4).walk(
            CopyLength(replayed, COSTS, 0.6, draft_costs=DRAFT_COSTS, draft_prior=1.5).choose,
            COSTS, None, DRAFT_COSTS, 1.5)
        assert walked.steps == len(out.steps)
        assert walked.choices == [s.drafted if s.copied else 0 for s in out.steps]
        assert np.allclose(live.seen, replayed.seen, atol=1e-5)
        copies += out.stats.lookup_steps
        # the draft's candidates decide the drafted steps: with other hits, another walk
        wrong = ByConfidence()
        flipped = Replay(Trace(trace.prompt, trace.tokens, trace.conf,
                               [1 - h for h in trace.hits]), 8, 1, 4)
        other = flipped.walk(CopyLength(wrong, COSTS, 0.6, draft_costs=DRAFT_COSTS,
                                        draft_prior=1.5).choose, COSTS, None, DRAFT_COSTS, 1.5)
        assert other.steps != walked.steps or not np.allclose(wrong.seen, live.seen)
    assert 0 < copies < sum(len(t.tokens) for t in traces) / 2


def test_the_oracle_is_at_least_as_fast_as_any_rule(pair):
    traces = draft_hits(pair, target_traces(pair, PROMPTS, 30), width=3)
    policy = CopyLength(ByConfidence(), COSTS, 0.6, draft_costs=DRAFT_COSTS, draft_prior=1.5)
    skips = []
    for trace in traces:
        r = Replay(trace, 8, 1, 4)
        alone, beside = r.oracle_speedup(COSTS), r.oracle_speedup(COSTS, DRAFT_COSTS)
        rules = [r.speedup(policy.choose, COSTS, DRAFT_COSTS, 1.5),
                 r.speedup(never, COSTS, DRAFT_COSTS, 1.5),
                 *(r.speedup(copy_all(k), COSTS[: k + 1], DRAFT_COSTS, 1.5) for k in (1, 8))]
        assert beside >= max(rules) - 1e-9 and beside >= alone - 1e-9
        assert alone >= max(r.speedup(copy_all(k), COSTS[: k + 1]) for k in (0, 2, 8)) - 1e-9
        # without the target-alone step: still at least every rule beside the draft
        choices = r.oracle_speedup(COSTS, DRAFT_COSTS, alone=False)
        assert max(rules) - 1e-9 <= choices <= beside + 1e-9
        skips.append(choices < beside - 1e-9)
    assert any(skips)  # where the draft misses, decoding alone is faster in hindsight
    with pytest.raises(ValueError, match="hits"):
        Replay(Trace([1, 2], [3, 4], [0.5, 0.5]), 8, 1, 4).walk(never, COSTS, None, DRAFT_COSTS)


def test_a_policy_trained_beside_a_draft_is_lossless_alone_and_in_batches(pair, reference):
    traces = draft_hits(pair, target_traces(pair, PROMPTS, 40), width=3)
    policy, _, facts = fit(traces, COSTS, draft_costs=DRAFT_COSTS)
    assert policy.draft_costs == DRAFT_COSTS
    assert policy.draft_prior == pytest.approx(1 + np.mean([h for t in traces
                                                             for h in t.hits[:-1]]))
    assert facts["draft_prior"] == policy.draft_prior
    dec = beside_draft(pair, policy, 40)
    assert [dec.generate(p).token_ids for p in PROMPTS] == reference
    assert [r.token_ids for r in dec.generate_batch(PROMPTS, batch_size=3)] == reference


def test_out_of_fold_decides_each_output_by_a_policy_not_fitted_on_it(pair, monkeypatch):
    import train.copy.fit as C

    traces = draft_hits(pair, target_traces(pair, PROMPTS * 2, 30), width=3)
    fitted, real_fit = [], C.fit

    def recording_fit(train, *args, **kwargs):
        policy, text, facts = real_fit(train, *args, **kwargs)
        fitted.append(({id(t) for t in train}, policy))
        return policy, text, facts

    monkeypatch.setattr(C, "fit", recording_fit)
    speed = C.out_of_fold(traces, COSTS, folds=3, draft_costs=DRAFT_COSTS)
    assert len(fitted) == 3
    for trace, s in zip(traces, speed, strict=True):
        deciders = [p for train, p in fitted if id(trace) not in train]
        assert len(deciders) == 1  # every output is left out of exactly one fold
        p = deciders[0]
        assert s == Replay(trace, 8, 1, 4).speedup(p.choose, COSTS, DRAFT_COSTS, p.draft_prior)


def test_a_trained_policy_is_lossless_alone_and_in_batches(pair, reference):
    policy, text, facts = fit(target_traces(pair, PROMPTS, 40), COSTS)
    assert facts["rows"] > 0 and 0 < facts["accept_share"] < 1
    assert policy.rate > 0 and text.startswith("tree")
    dec = decoder(pair, policy)
    alone = [dec.generate(p) for p in PROMPTS]
    assert [r.token_ids for r in alone] == reference
    assert sum(r.stats.lookup_steps for r in alone) > 0
    batch = dec.generate_batch(PROMPTS, batch_size=3)
    assert [r.token_ids for r in batch] == reference


def test_a_decoder_refuses_a_chain_shorter_than_the_policy_copies(pair):
    cfg = DecodeConfig(k_config=(1,) * 4, lookup=4)
    with pytest.raises(MCSDError, match="lookup >= 8"):
        MCSDDecoder(pair, cfg, "none", copy_length=CopyLength(Constant(0.5), COSTS, 1.0))


def test_step_costs_read_the_profile():
    profile = CostProfile(tokens=[1, 4], target_s=[1.0, 1.3], draft_s=[0.1, 0.1],
                          step_overhead_s=0.01)
    assert step_costs(profile, 3) == pytest.approx([1.01, 1.11, 1.21, 1.31])


def test_method_names_and_missing_folders(tmp_path):
    with pytest.raises(MCSDError, match="mcsd train --decision copy"):
        check_method(f"lookup-learned:{tmp_path}")
    with pytest.raises(MCSDError, match="name the folder"):
        check_method("lookup-learned")
    (tmp_path / "copy_length.json").write_text(json.dumps({"format": "other"}))
    with pytest.raises(MCSDError, match="retrain"):
        check_method(f"lookup-learned:{tmp_path}")
    assert short_name("lookup-learned:/a/b/copy") == "lookup-learned:copy"


def test_train_lookup_trains_reports_and_refuses_bad_input(toy_tiny, tmp_path, capsys):
    profile = tmp_path / "cost.json"
    CostProfile(tokens=[1, 9], target_s=[0.01, 0.012], draft_s=[0.001, 0.003]).save(profile)
    out = tmp_path / "copy"
    base = ["train", "--decision", "copy", "--target", str(toy_tiny / "target"), "--draft",
            str(toy_tiny / "draft"), "--prompts", "toy-code", "--limit", "3",
            "--max-new-tokens", "24", "--max-copy", "8", "--dtype", "fp32"]
    assert main([*base, "--cost-profile", str(profile), "--out", str(out),
                 "--traces", str(tmp_path / "traces.json")]) == 0
    printed = capsys.readouterr().out
    assert "toy-code (trained)" in printed and "lookup-learned:" in printed
    spec = json.loads((out / "copy_length.json").read_text())
    assert spec["report"][0]["prompts"] == 3 and len(spec["costs"]) == 9
    assert CopyLength.load(out).max_copy == 8
    # a second run refuses to overwrite without --force; with it, reuses the cached outputs
    assert main([*base, "--cost-profile", str(profile), "--out", str(out)]) == 2
    assert "--force" in capsys.readouterr().err
    assert main([*base, "--cost-profile", str(profile), "--out", str(out), "--max-copy", "4",
                 "--force", "--traces", str(tmp_path / "traces.json")]) == 0
    printed = capsys.readouterr()
    assert "vs lookup:4:3" in printed.out and "target outputs" not in printed.err
    assert CopyLength.load(out).max_copy == 4
    short = tmp_path / "short.json"
    CostProfile(tokens=[1, 4], target_s=[0.01, 0.012], draft_s=[0.001, 0.001]).save(short)
    assert main([*base, "--cost-profile", str(short), "--out", str(tmp_path / "o2")]) == 2
    assert "--max-tokens 9" in capsys.readouterr().err
    assert not (tmp_path / "o2").exists()
    sampled = [*base, "--cost-profile", str(profile), "--out", str(out), "--force",
               "--temperature", "0.2"]
    assert main([*sampled, "--check-prompts", "1"]) == 2
    assert "--eval-prompts" in capsys.readouterr().err
    assert main([*sampled, "--traces", str(tmp_path / "traces.json")]) == 2  # greedy outputs
    assert "temperature" in capsys.readouterr().err
    assert main([*sampled, "--eval-prompts", "toy-code"]) == 2
    assert "held-out prompts must come from other sets" in capsys.readouterr().err
    assert main([*sampled, "--eval-prompts", "toy-doc", "--eval-limit", "2", "--check-prompts",
                 "1"]) == 0
    assert "replay vs end to end on 1 held-out prompts at temperature 0.2" in (
        capsys.readouterr().out)
    assert CopyLength.load(out).temperature == 0.2
    check = json.loads((out / "check.json").read_text())
    assert set(check["per_method"]) == {"ar", "lookup:8:3", "lookup:8:2", "learned"}
    # decoding at another temperature warns once a process, not once per eval category
    import warnings

    from mcsd_runtime.evaluate.runners import learned_lookup_runner
    from mcsd_runtime.models.pair import load_pair

    tiny = load_pair(toy_tiny / "target", toy_tiny / "draft", device="cpu", dtype="float32")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for _ in range(3):
            learned_lookup_runner(tiny, DecodeConfig(k_config=(1,), max_new_tokens=8), out)
    assert ["trained on outputs at temperature 0.2 and decodes at 0" in str(w.message)
            for w in seen] == [True]


def test_train_lookup_beside_a_draft_replays_what_the_decoder_does(toy_tiny, tmp_path, capsys):
    profile = tmp_path / "cost.json"
    CostProfile(tokens=[1, 9], target_s=[0.01, 0.012], draft_s=[0.001, 0.003]).save(profile)
    out, alone = tmp_path / "copy", tmp_path / "alone"
    base = ["train", "--decision", "copy", "--target", str(toy_tiny / "target"), "--draft",
            str(toy_tiny / "draft"), "--prompts", "toy-code", "--limit", "3",
            "--max-new-tokens", "24", "--max-copy", "8", "--dtype", "fp32", "--cost-profile",
            str(profile)]
    # sampled: outputs drawn through the first depth's verification, cached with their hits
    traces = tmp_path / "drafted.json"
    sampled = [*base, "--out", str(tmp_path / "sampled"), "--k-config", "2,1",
               "--temperature", "0.5", "--traces", str(traces), "--eval-prompts", "toy-doc",
               "--eval-limit", "2", "--check-prompts", "1", "--folds", "0", "--limit", "6"]
    assert main(sampled) == 0
    printed = capsys.readouterr()
    assert "outputs with drafted steps" in printed.err and "temperature 0.5" in printed.out
    assert "out of fold" not in printed.out
    spec = json.loads((tmp_path / "sampled" / "copy_length.json").read_text())
    assert spec["temperature"] == 0.5 and spec["beside_draft"] == "2,1"
    assert spec["training_mix"]["folds"] == 0
    cached = json.loads(traces.read_text())
    assert cached["key"]["drafted"]["width"] == 2
    assert all(len(v) == 3 and len(v[2]) == len(v[0]) for v in cached["traces"].values())
    assert set(json.loads((tmp_path / "sampled" / "check.json").read_text())["per_method"]) == {
        "ar", "lookup:8:3+static:1", "lookup:8:2+static:1", "static:1", "learned"}
    # greedy outputs of the same prompts are another cache
    assert main([*base, "--out", str(tmp_path / "o4"), "--k-config", "2,1", "--traces",
                 str(traces)]) == 2
    assert "drafted" in capsys.readouterr().err
    assert main([*base, "--out", str(tmp_path / "o3"), "--folds", "1"]) == 2
    assert "--folds not 1" in capsys.readouterr().err and not (tmp_path / "o3").exists()
    assert main([*base, "--out", str(out), "--k-config", "2,1", "--eval-prompts", "toy-doc",
                 "--eval-limit", "2", "--check-prompts", "1"]) == 0
    printed = capsys.readouterr().out
    assert "lookup:8:3+static:1" in printed and "share*" in printed
    assert "training mix, 3 outputs pooled" in printed
    assert f"lookup-learned:{out}+static:1 --k-config 2,1" in printed
    spec = json.loads((out / "copy_length.json").read_text())
    assert spec["beside_draft"] == "2,1" and len(spec["draft_costs"]) == 10
    assert spec["min_ngram"] == 2  # the default beside a draft
    for row in spec["report"]:
        assert row["deploy"] == "lookup:8:3+static:1" and row["draft_vs_ar"] > 0
        assert row["oracle_vs_ar"] >= max(row["learned_vs_ar"], row["best_static_vs_ar"]) - 1e-9
        assert row["oracle_vs_ar"] + 1e-9 >= row["oracle_choices_vs_ar"] >= max(
            row["learned_vs_ar"], row["best_static_vs_ar"]) - 1e-9
    mix = spec["training_mix"]
    assert mix["outputs"] == 3 and mix["folds"] == 3
    assert mix["oracle_vs_ar"] + 1e-9 >= mix["oracle_choices_vs_ar"] >= mix["learned_vs_ar"] - 1e-9
    # greedy: replay takes the decoder's steps for every method, the draft's included
    check = json.loads((out / "check.json").read_text())
    assert set(check["per_method"]) == {"ar", "lookup:8:3+static:1", "lookup:8:2+static:1",
                                        "static:1", "learned"}
    assert all(r["steps_replayed"] == r["steps_measured"] for r in check["per_method"].values())
    # ...so the profile prices the decoder's own steps as the replay priced the trace's
    for name, r in check["per_method"].items():
        assert r["priced"] == pytest.approx(r["replayed"], rel=1e-9), name
    # decoded composed, with the draft; a policy trained without one is refused composed
    check_method(f"lookup-learned:{out}+static:1")
    assert CopyLength.load(out).draft_tree == "2,1"
    import warnings

    from mcsd_runtime.evaluate.runners import learned_lookup_runner
    from mcsd_runtime.models.pair import load_pair

    tiny = load_pair(toy_tiny / "target", toy_tiny / "draft", device="cpu", dtype="float32")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for k_config in ("2,1", "3,1", "3,1"):  # another tree warns, once
            learned_lookup_runner(tiny, DecodeConfig(k_config=k_config, max_new_tokens=8), out,
                                  "static:1")
    assert ["trained beside the draft tree 2,1 and decodes on 3,1" in str(w.message)
            for w in seen] == [True]
    assert short_name("lookup-learned:/a/b/copy+stopper:/c/lgb") == (
        "lookup-learned:copy+stopper:lgb")
    assert main([*base, "--out", str(alone)]) == 0
    with pytest.raises(MCSDError, match="--k-config K_CONFIG"):
        check_method(f"lookup-learned:{alone}+static:1")
    with pytest.raises(MCSDError, match="name a stopper after"):
        check_method(f"lookup-learned:{out}+")


def test_sampled_outputs_are_seeded_by_prompt_and_report_the_top_probability(pair):
    sampled = target_traces(pair, PROMPTS[:2], 20, temperature=1.0, seed=3)
    assert target_traces(pair, PROMPTS[1:2], 20, temperature=1.0, seed=3)[0] == sampled[1]
    greedy = target_traces(pair, PROMPTS[:2], 20)
    assert any(s.tokens != g.tokens for s, g in zip(sampled, greedy, strict=True))
    # the first token comes from the same distribution either way: the same top-1 probability
    assert sampled[0].conf[0] == pytest.approx(greedy[0].conf[0])
    assert all(0 < c <= 1 for t in sampled for c in t.conf)


def _mean_and_se(values: list[int]) -> tuple[float, float]:
    return float(np.mean(values)), float(np.std(values, ddof=1) / np.sqrt(len(values)))


def _sampled_steps(pair, cfg: DecodeConfig, stopper: str, prompt: list[int], n: int) -> list:
    """Each seed's steps (0..n-1) under `cfg`, the seeds decoded as rows of one batch in row
    mode: each row drafts its own stopper's tree, so it takes the steps `generate` takes with
    its seed (checked on seed 0)."""
    dec = MCSDDecoder(pair, replace(cfg, batch_depth="row"), stopper)
    runs = [r.steps for r in dec.generate_batch([prompt] * n, batch_size=n, seeds=range(n))]
    def kept(steps: list) -> list[tuple]:
        return [(s.drafted, s.accepted, s.committed, s.copied) for s in steps]

    assert kept(dec.generate(prompt, seed=0).steps) == kept(runs[0])
    return runs


def test_replaying_sampled_outputs_predicts_the_sampling_decoders_steps(pair):
    """A copy is accepted with the target's probability of it, i.e. when it equals a sampled
    output's token: replay over sampled outputs takes as many steps on average as the sampling
    decoder (seeded, 30 runs each); replaying the greedy output instead is caught (about 6
    standard errors away at 30 runs)."""
    temperature, n = 0.3, 30
    cfg = DecodeConfig(k_config=(1,) * 4, lookup=4, lookup_min_ngram=1, temperature=temperature,
                       max_new_tokens=30, eos_token_ids=())
    real = _mean_and_se([len(r) for r in _sampled_steps(pair, cfg, "none", REPEATING, n)])

    def replayed(trace) -> int:
        return Replay(trace, 4, 1, 4).walk(copy_all(4), COSTS[:5]).steps

    sampled = _mean_and_se([replayed(target_traces(pair, [REPEATING], 30, temperature, s)[0])
                            for s in range(n)])
    se = np.hypot(real[1], sampled[1])
    assert abs(real[0] - sampled[0]) < 3 * se
    assert abs(real[0] - replayed(target_traces(pair, [REPEATING], 30)[0])) > 3 * se


@pytest.mark.parametrize("kind", ["draft", "feature draft"])
def test_sampled_drafted_steps_replay_the_sampling_decoders_steps(pair, feature_pair, kind):
    """When sampling, a drafted step accepts a candidate by chance: outputs drawn through the
    first depth's verification replay `static:1` in as many steps on average as the sampling
    decoder takes (seeded, 30 runs each); reading a hit as "the output's token is among the
    draft's top candidates" (the greedy rule) on sampled outputs is caught (over 20 standard
    errors away at 30 runs)."""
    p = pair if kind == "draft" else feature_pair
    temperature, n, prompt = 1.0, 30, PROMPTS[1]
    cfg = DecodeConfig(k_config=(3, 1), temperature=temperature, max_new_tokens=20,
                       eos_token_ids=())
    real = _mean_and_se([len(r) for r in _sampled_steps(p, cfg, "static:1", prompt, n)])

    def replayed(trace) -> int:
        return Replay(trace, 1, 4, 4).walk(never, COSTS[:2], None, DRAFT_COSTS, 1.5).steps

    drafted = [drafted_traces(p, [prompt], 20, temperature, 3, seed=s)[0] for s in range(n)]
    ours = _mean_and_se([replayed(t) for t in drafted])
    greedy_rule = _mean_and_se([replayed(draft_hits(p, target_traces(p, [prompt], 20,
                                                                     temperature, s), 3)[0])
                                for s in range(n)])
    se = np.hypot(real[1], ours[1])
    assert abs(real[0] - ours[0]) < 3 * se
    assert abs(real[0] - greedy_rule[0]) > 3 * np.hypot(real[1], greedy_rule[1])
    assert all(len(t.hits) == len(t.tokens) == 20 for t in drafted)


def test_drafted_outputs_are_the_targets_samples(pair):
    """Verification is lossless, so an output drawn through it is the target's sample: the first
    token of 300 seeded draws follows the target's distribution at the temperature (chi-square),
    and not its distribution at another."""
    import torch
    from scipy.stats import chisquare

    prompt, temperature = PROMPTS[1], 0.7
    firsts = [drafted_traces(pair, [prompt], 1, temperature, 3, seed=s)[0].tokens[0]
              for s in range(300)]
    with torch.no_grad():
        logits = pair.target(input_ids=torch.tensor([prompt])).logits[0, -1].double()

    def pvalue(t: float) -> float:
        expected = torch.softmax(logits / t, -1) * len(firsts)
        keep = expected >= 5  # chi-square's cells; the rest pooled into one
        observed = torch.bincount(torch.tensor(firsts), minlength=len(expected)).double()
        obs = torch.cat([observed[keep], observed[~keep].sum()[None]])
        exp = torch.cat([expected[keep], expected[~keep].sum()[None]])
        return float(chisquare(obs.numpy(), exp.numpy()).pvalue)

    assert pvalue(temperature) > 1e-3
    assert pvalue(1.5) < 1e-6


def test_a_sampled_decode_replays_its_own_output_step_for_step(pair):
    """Under sampling a copy is accepted exactly when it equals the token the decoder commits,
    so replaying the decoder's own output takes its steps, each one; another draw's output
    does not."""
    cfg = DecodeConfig(k_config=(1,) * 4, lookup=4, lookup_min_ngram=1, temperature=1.0,
                       max_new_tokens=30, eos_token_ids=())
    dec = MCSDDecoder(pair, cfg, "none")
    outs = [dec.generate(REPEATING, seed=s) for s in range(8)]

    def replayed(tokens: list[int]) -> int:
        trace = Trace(REPEATING, tokens, [0.5] * len(tokens))
        return Replay(trace, 4, 1, 4).walk(copy_all(4), COSTS[:5]).steps

    assert len({len(o.steps) for o in outs}) > 1  # the draws differ
    for out in outs:
        assert replayed(out.token_ids) == len(out.steps)
    assert any(replayed(a.token_ids) != len(b.steps) for a, b in zip(outs, outs[1:], strict=False))


def test_the_end_to_end_check_takes_the_replays_steps(pair):
    from replay.check import capped, format_check
    from replay.check import copy_check as end_to_end_check

    traces = {"a": target_traces(pair, PROMPTS[:2], 24), "b": target_traces(pair, PROMPTS[2:], 24)}
    policy = CopyLength(ByConfidence(), COSTS, rate=0.6)
    statics = capped(["lookup:8:3", "lookup:15:1"], policy.max_copy)
    assert statics == ["lookup:8:3", "lookup:8:1"]
    check = end_to_end_check(pair, policy, traces, statics, limit=2)
    assert check["prompts"] == 4 and set(check["learned_vs_deploy_measured"]) == {"a", "b"}
    rows = check["per_method"]
    assert set(rows) == {"ar", "lookup:8:3", "lookup:8:1", "learned"}
    assert all(r["steps_replayed"] == r["steps_measured"] for r in rows.values())
    assert rows["ar"]["steps_measured"] == 4 * 24 > rows["lookup:8:1"]["steps_measured"]
    assert "steps 96 / 96" in format_check(check)


@pytest.mark.parametrize("kind", ["draft", "feature draft"])
def test_sampled_composed_steps_replay_the_sampling_decoders_steps(pair, feature_pair, kind):
    """Prompt lookup composed with a drafted first depth (`lookup:K:N+static:1`), sampled: replay
    over outputs drawn through the first depth's verification takes as many steps on average as
    the composed sampling decoder (seeded, 30 runs each) — copies and drafted steps
    interleaved, the check's statics at T > 0; reading the drafted steps' hits by the greedy
    rule instead is caught (over 15 standard errors away at 30 runs)."""
    p = pair if kind == "draft" else feature_pair
    temperature, n, k = 1.0, 30, 4
    cfg = DecodeConfig(k_config=(3, 1), lookup=k, lookup_min_ngram=1, temperature=temperature,
                       max_new_tokens=30, eos_token_ids=())
    runs = _sampled_steps(p, cfg, "static:1", REPEATING, n)
    assert all(any(s.copied for s in r) and any(not s.copied for s in r) for r in runs[:5])
    real = _mean_and_se([len(r) for r in runs])

    def replayed(trace) -> int:
        return Replay(trace, k, 1, 4).walk(copy_all(k), COSTS[: k + 1], None, DRAFT_COSTS,
                                           1.5).steps

    drafted = [drafted_traces(p, [REPEATING], 30, temperature, 3, seed=s)[0] for s in range(n)]
    ours = _mean_and_se([replayed(t) for t in drafted])
    assert abs(real[0] - ours[0]) < 3 * np.hypot(real[1], ours[1]), (real, ours)
    greedy_rule = _mean_and_se([replayed(draft_hits(p, target_traces(p, [REPEATING], 30,
                                                                     temperature, s), 3)[0])
                                for s in range(n)])
    assert abs(real[0] - greedy_rule[0]) > 3 * np.hypot(real[1], greedy_rule[1]), greedy_rule


def test_a_copy_length_priced_by_a_serving_engines_profile(toy_tiny, tmp_path, capsys):
    """An engine profile (`mcsd profile --engine vllm`) as --cost-profile prices each copy length
    by the engine's step with K=k drafted tokens at one request; it is refused beside a draft
    and where it lacks a K the copy lengths need."""
    from mcsd_runtime.serving.engine_profile import EngineProfile, ProfilePoint
    from train.copy.trainer import engine_costs

    def engine(path, ks, concurrency=1):
        points = tuple(ProfilePoint(concurrency, k, 0.02 + 0.001 * k, 50) for k in ks)
        return EngineProfile("vllm", "0.32.0", "toy", "bfloat16", "ngram", points).save(path)

    full, short = engine(tmp_path / "e.json", range(5)), engine(tmp_path / "s.json", range(3))
    base = ["train", "--decision", "copy", "--target", str(toy_tiny / "target"), "--draft",
            str(toy_tiny / "draft"), "--prompts", "toy-code", "--limit", "3",
            "--max-new-tokens", "24", "--max-copy", "4", "--dtype", "fp32",
            "--traces", str(tmp_path / "traces.json")]
    out = tmp_path / "copy"
    assert main([*base, "--cost-profile", str(full), "--out", str(out)]) == 0
    assert f"mcsd eval --engine vllm --methods proposer:{out}" in capsys.readouterr().out
    assert CopyLength.load(out).costs == pytest.approx([0.02 + 0.001 * k for k in range(5)])
    assert main([*base, "--cost-profile", str(short), "--out", str(tmp_path / "o2")]) == 2
    err = capsys.readouterr().err
    assert "needs K=3, 4" in err and "--draft-lengths 0,1,2,3,4" in err
    assert main([*base, "--cost-profile", str(full), "--out", str(tmp_path / "o3"),
                 "--k-config", "2,1"]) == 2
    assert "prompt lookup's steps only" in capsys.readouterr().err
    # copying nothing is never priced below serving without speculation (where it was timed)
    points = EngineProfile.load(full).points
    for plain, first in ((0.03, 0.03), (0.01, 0.02)):
        timed = EngineProfile("vllm", "0.32.0", "toy", "bfloat16", "ngram", points,
                              (ProfilePoint(1, 0, plain, 50),))
        assert engine_costs(timed, full, 4) == pytest.approx(
            [first] + [0.02 + 0.001 * k for k in range(1, 5)])
    busy = engine(tmp_path / "b.json", range(5), concurrency=4)  # no point at one request
    assert main([*base, "--cost-profile", str(busy), "--out", str(tmp_path / "o4")]) == 2
    assert "times 4 requests, not one" in capsys.readouterr().err
    assert not any((tmp_path / o).exists() for o in ("o2", "o3", "o4"))
