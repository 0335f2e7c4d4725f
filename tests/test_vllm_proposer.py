"""The proposer class vLLM runs (`mcsd_runtime.serving.vllm_proposer`), driven here as vLLM
drives it (rows of contexts, the tokens each step committed) without vLLM: the draft's chain
under a stopper, its cache kept in step with what the engine accepted, requests recognised as
rows move, and the copy length composed with the draft. vLLM's own runs of it (outputs equal
plain vLLM's): tests/test_vllm_engine.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from mcsd_runtime.decisions.builtin import StopperBase, SwitchStopper
from mcsd_runtime.decisions.features import DECISION_FEATURES, Trajectory
from mcsd_runtime.errors import MCSDError
from mcsd_runtime.serving.draft_chain import ChainFrontier, DraftChain, common_prefix
from mcsd_runtime.serving.vllm_proposer import PROPOSER_ENV, MCSDProposer, ProposerSpec

K = 4


class Config:
    class speculative_config:  # noqa: N801 (vLLM's attribute name)
        num_speculative_tokens = K


@pytest.fixture(scope="module")
def draft(toy_tiny):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(toy_tiny / "draft", dtype=torch.float32).eval()


@torch.inference_mode()
def greedy(model, context: list[int], n: int) -> list[int]:
    """The draft's greedy continuation of `context`, each token from a full forward (no
    cache): what a chain must propose."""
    ids = list(context)
    for _ in range(n):
        ids.append(int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(context):]


def proposer(monkeypatch, toy_tiny, stopper: str | None = "static:4",
             copy: str | None = None, schedule: str | None = None) -> MCSDProposer:
    spec = ProposerSpec(copy=copy, stopper=stopper, draft=str(toy_tiny / "draft"),
                        schedule=schedule)
    monkeypatch.setenv(PROPOSER_ENV, spec.to_env())
    return MCSDProposer(Config)


def step(p: MCSDProposer, contexts: list[list[int]], sampled: list[list[int]]):
    """One `propose` call as vLLM makes it: the rows' contexts padded into one array."""
    width = max(map(len, contexts)) + 8
    ids = np.zeros((len(contexts), width), dtype=np.int64)
    for i, c in enumerate(contexts):
        ids[i, : len(c)] = c
    return p.propose(sampled, np.array([len(c) for c in contexts]), ids)


PROMPT = [5, 9, 14, 3, 22, 7, 31, 2, 11]


def test_a_chain_proposes_the_drafts_greedy_tokens_and_keeps_its_cache_in_step(
        monkeypatch, toy_tiny, draft):
    p = proposer(monkeypatch, toy_tiny)
    first = step(p, [PROMPT], [[PROMPT[-1]]])[0]
    assert first == greedy(draft, PROMPT, K)
    chain = p.rows[0].chain
    assert chain.tokens == PROMPT + first[:-1]  # the last draft never went through it
    # the engine accepted two drafts and committed a token of its own: the cache keeps the
    # accepted prefix, crops the rejected drafts and feeds the two new tokens in one forward
    ctx = PROMPT + first[:2] + [first[2] + 1]
    forwards = chain.forwards
    second = step(p, [ctx], [first[:2] + [first[2] + 1]])[0]
    assert second == greedy(draft, ctx, K)
    assert chain.forwards - forwards == K  # one feed, then K - 1 depths
    assert p.rows[0].chain is chain  # the same request's state
    # the prefill's token (a step without a draft), then the step that accepted two
    assert chain.trajectory.values() == _trajectory([(0, 1, 0), (2, 3, K)])


def _trajectory(steps: list[tuple[int, int, int]]) -> list[float]:
    t = Trajectory()
    for accepted, committed, drafted in steps:
        t.update(accepted, committed, drafted)
    return t.values()


class Depth(StopperBase):
    """Drafts `depth` tokens; records every frontier it sees and every update."""

    def __init__(self, depth: int, draft_at_all: bool = True) -> None:
        self.depth, self.draft_at_all = depth, draft_at_all
        self.seen: list[ChainFrontier] = []
        self.updates: list[tuple[int, int]] = []

    def reset(self) -> None:
        self.seen, self.updates = [], []

    def should_draft(self, start) -> bool:
        return self.draft_at_all

    def should_continue(self, frontier) -> bool:
        self.seen.append(frontier)
        return frontier.depth < self.depth

    def update(self, drafted: int, accepted: int) -> None:
        self.updates.append((drafted, accepted))


def test_the_stopper_cuts_the_chain_and_sees_the_decoders_features(draft):
    chain = DraftChain.start(Depth(2))
    tokens = chain.propose(draft, PROMPT, K)
    assert tokens == greedy(draft, PROMPT, 2)
    stopper = chain.stopper
    assert [f.depth for f in stopper.seen] == [1, 2] and chain.forwards == 2
    with torch.inference_mode():
        q = torch.softmax(draft(input_ids=torch.tensor([PROMPT])).logits[0, -1], -1)
    f = stopper.seen[0]
    x = f.decision_features()[0]
    col = dict(zip(DECISION_FEATURES, x, strict=True))
    assert (col["depth"], col["sibling_rank"], col["frontier_size"]) == (1, 0, 1)
    assert col["draft_prob"] == pytest.approx(float(q.max()), rel=1e-5)
    assert col["log_path_prob"] == pytest.approx(float(q.max().log()), rel=1e-5)
    top2 = q.topk(2).values
    assert col["q_margin"] == pytest.approx(float(top2[0] - top2[1]), rel=1e-4, abs=1e-6)
    assert list(x[-4:]) == Trajectory().values()
    full = f.features()[0]  # the full matrix agrees with the decision subset, entropy besides
    assert float(f.column("q_entropy")[0]) == pytest.approx(
        float(torch.special.entr(q).sum()), rel=1e-4)
    assert float(full[3]) == pytest.approx(col["draft_prob"], rel=1e-6)
    assert stopper.seen[1].decision_features()[0][DECISION_FEATURES.index("log_path_prob")] < \
        col["log_path_prob"]


def test_a_stopper_that_does_not_draft_proposes_nothing_and_feeds_nothing(draft):
    chain = DraftChain.start(Depth(3, draft_at_all=False))
    assert chain.propose(draft, PROMPT, K) == [] and chain.forwards == 0


def test_outcomes_reach_the_requests_own_stopper_at_every_step(monkeypatch, toy_tiny):
    p = proposer(monkeypatch, toy_tiny)
    base = Depth(K)
    p.stopper = base
    first = step(p, [PROMPT], [[PROMPT[-1]]])[0]
    ctx = PROMPT + first[:1] + [first[1] + 1]
    step(p, [ctx], [[first[0], first[1] + 1]])
    own = p.rows[0].chain.stopper
    # the prefill's token, then the step that accepted one
    assert own is not base and own.updates == [(0, 0), (K, 1)] and base.updates == []
    own.draft_at_all = False  # a step it drafts nothing in still reaches it, as (0, 0)
    second = step(p, [ctx + [7]], [[7]])[0]
    step(p, [ctx + [7, 3]], [[3]])
    assert p.rows[0].chain.stopper is own
    assert second == [] and own.updates == [(0, 0), (K, 1), (K, 0), (0, 0)]


def test_a_skip_gate_closed_at_the_start_probes_after_its_steps_without_a_draft(
        monkeypatch, toy_tiny, draft):
    # the recent acceptance rate starts at the prior 1/2, below the gate's 0.6: no draft for
    # 3 steps (the prefill's among them), then a probe (a gate that never heard its idle steps
    # would never draft)
    p = proposer(monkeypatch, toy_tiny, stopper="switch:0.6:2:3")
    contexts = [PROMPT + [40, 41, 42, 43][:n] for n in range(5)]
    drafts = [step(p, [ctx], [[ctx[-1]]])[0] for ctx in contexts]
    # the probe's two tokens are rejected (the next context goes on with 42): closed again
    assert drafts == [[], [], greedy(draft, contexts[2], 2), [], []]


def test_requests_are_recognised_when_rows_move_and_new_ones_start_fresh(
        monkeypatch, toy_tiny, draft):
    p = proposer(monkeypatch, toy_tiny, stopper="static:2")
    a, b = PROMPT, [4, 4, 8, 15, 16, 23, 42]
    da, db = step(p, [a, b], [[a[-1]], [b[-1]]])
    chain_a, chain_b = p.rows[0].chain, p.rows[1].chain
    # vLLM moved b to row 0 and a new request c to row 1; a ended
    c = [30, 29, 28]
    b2 = b + db[:1] + [db[1] + 1]
    out = step(p, [b2, c], [[db[0], db[1] + 1], [c[-1]]])
    assert p.rows[0].chain is chain_b and p.rows[1].chain not in (chain_a, chain_b)
    assert out == [greedy(draft, b2, 2), greedy(draft, c, 2)]
    assert len(p.rows) == 2  # a's state went with its row


def test_the_copy_length_copies_where_it_pays_and_the_draft_drafts_elsewhere(
        monkeypatch, toy_tiny, draft):
    from mcsd_runtime.decisions import copy_length as C

    class Always:  # every copied token survives: copy the whole match
        def predict(self, x):
            return np.ones(len(x))

    policy = C.CopyLength(Always(), costs=[1.0, 1.0, 1.0, 1.0, 1.0], rate=0.01)
    monkeypatch.setattr(C.CopyLength, "load", classmethod(lambda cls, folder: policy))
    p = proposer(monkeypatch, toy_tiny, copy="policy-folder")
    repeat = PROMPT + [60, 61, 62, 63, 64] + PROMPT[:3]  # PROMPT[:3] was followed by PROMPT[3:]
    no_match = [50, 51, 52]
    copied, drafted = step(p, [repeat, no_match], [[repeat[-1]], [no_match[-1]]])
    assert copied == PROMPT[3:3 + K] and p.rows[0].by == "copy"
    assert drafted == greedy(draft, no_match, K) and p.rows[1].by == "draft"
    # the copy's outcome goes to the copy history, not to the draft's stopper
    ctx = repeat + PROMPT[3:5] + [0]
    step(p, [ctx, no_match + drafted[:1] + [1]], [PROMPT[3:5] + [0], [drafted[0], 1]])
    state = p.rows[0]
    assert (state.history.last_copied, state.history.last_accepted) == (K, 2)
    assert state.chain.trajectory.values() == _trajectory([(0, 1, 0), (0, 3, 0)])
    assert p.rows[1].history.draft_value != policy.history().draft_value  # learnt from a draft
    # a step where the stopper drafted nothing tells the copy history nothing of the draft
    p.rows[1].chain.stopper = Depth(K, draft_at_all=False)
    ctx = no_match + drafted[:1] + [1]
    assert step(p, [ctx + [7]], [[7]]) == [[]]  # (it hears of its last draft, rejected)
    value = p.rows[0].history.draft_value
    step(p, [ctx + [7, 8]], [[8]])
    assert p.rows[0].history.draft_value == value


def test_the_spec_is_checked_and_read_from_the_environment(monkeypatch):
    with pytest.raises(MCSDError, match="a copy length, a stopper, or both"):
        ProposerSpec()
    with pytest.raises(MCSDError, match="give its folder"):
        ProposerSpec(stopper="static:2")
    monkeypatch.delenv(PROPOSER_ENV, raising=False)
    with pytest.raises(MCSDError, match=f"set {PROPOSER_ENV}"):
        ProposerSpec.from_env()
    monkeypatch.setenv(PROPOSER_ENV, "runs/copy")
    with pytest.raises(MCSDError, match="is not a proposer spec"):
        ProposerSpec.from_env()
    spec = ProposerSpec(copy="a", stopper="static:2", draft="d")
    monkeypatch.setenv(PROPOSER_ENV, spec.to_env())
    assert ProposerSpec.from_env() == spec


def test_a_learned_stopper_for_another_chain_is_refused(monkeypatch, toy_tiny):
    class Tied(StopperBase):
        def should_continue(self, frontier) -> bool:
            return True

        def check_tree(self, k_config) -> None:
            raise MCSDError(f"trained on another tree than {k_config}")

    import mcsd_runtime.decisions.builtin as B

    monkeypatch.setattr(B, "parse_stopper_spec", lambda text: type(
        "S", (), {"build": staticmethod(lambda: Tied())})())
    with pytest.raises(MCSDError, match="than 1,1,1,1"):
        proposer(monkeypatch, toy_tiny, stopper="anything")


def schedule_folder(tmp_path, bands) -> str:
    from mcsd_runtime.serving.schedule import Schedule

    Schedule(bands=bands).write(tmp_path / "schedule")
    return str(tmp_path / "schedule")


def test_a_schedule_caps_each_steps_drafts_by_the_requests_decoding(
        monkeypatch, toy_tiny, draft, tmp_path):
    """Bands: K=4 at one request, 2 at two, 0 from three: the chain drafts 4, then 2 a row,
    then nothing; a row still in prefill does not count."""
    p = proposer(monkeypatch, toy_tiny,
                 schedule=schedule_folder(tmp_path, ((1, 1, 4), (2, 2, 2), (3, None, 0))))
    other = [4, 4, 8, 1, 9, 30]
    assert step(p, [PROMPT], [[PROMPT[-1]]]) == [greedy(draft, PROMPT, 4)]
    assert step(p, [PROMPT, other, [6, 6]], [[PROMPT[-1]], [other[-1]], []]) == [
        greedy(draft, PROMPT, 2), greedy(draft, other, 2), []]
    third = [12, 13, 14]
    assert step(p, [PROMPT, other, third],
                [[PROMPT[-1]], [other[-1]], [third[-1]]]) == [[], [], []]


def test_common_prefix():
    assert common_prefix([1, 2, 3], [1, 2, 4, 5]) == 2
    assert common_prefix([1, 2], [1, 2, 3]) == 2 and common_prefix([], [1]) == 0
    assert common_prefix([7], [1]) == 0


# ------------------------------------------------------------------ `proposer:` in --methods
def copy_folder(tmp_path, max_copy: int = 6):
    """A folder that reads as a copy length (its spec only: parsing reads no model)."""
    import json

    from mcsd_runtime.decisions.copy_length import FEATURES, FORMAT, SPEC_FILE

    folder = tmp_path / "copy"
    folder.mkdir()
    (folder / SPEC_FILE).write_text(json.dumps({"format": FORMAT, "features": list(FEATURES),
                                                "costs": [1.0] * (max_copy + 1)}))
    return folder


def chain_stopper(tmp_path, k_config=(1, 1, 1, 1, 1, 1)):
    """The fixture LightGBM stopper's folder, its recorded tree set to `k_config`."""
    import json
    import shutil
    from pathlib import Path

    src = Path(__file__).parent / "fixtures" / "stoppers-b8df3aa" / "lightgbm"
    folder = tmp_path / "stop"
    shutil.copytree(src, folder)
    spec = json.loads((folder / "stopper.json").read_text())
    (folder / "stopper.json").write_text(json.dumps(spec | {"k_config": list(k_config)}))
    return folder


def env_spec(method) -> ProposerSpec:
    (name, value), = method.env
    assert name == PROPOSER_ENV
    return ProposerSpec(**__import__("json").loads(value))


def test_proposer_methods_parse_into_the_spec_the_class_reads(tmp_path):
    from mcsd_runtime.serving.vllm_methods import PROPOSER_CHAIN, PROPOSER_CLASS, parse_method

    copy, stop = copy_folder(tmp_path), chain_stopper(tmp_path)
    found: list[int] = []

    def draft():  # the pair's draft, found only for a method that drafts
        found.append(1)
        return "/drafts/d"

    m = parse_method(f"proposer:{copy}", draft=draft)
    assert m.speculative == {"method": "custom_class", "model": PROPOSER_CLASS,
                             "num_speculative_tokens": 6}
    assert env_spec(m) == ProposerSpec(copy=str(copy.resolve())) and not found
    m = parse_method(f"proposer:stopper:{stop}", draft=draft)
    assert env_spec(m) == ProposerSpec(stopper=f"stopper:{stop.resolve()}", draft="/drafts/d",
                                       depth=6)
    m = parse_method(f"proposer:{copy}+static:3", draft=draft)
    assert env_spec(m) == ProposerSpec(copy=str(copy.resolve()), stopper="static:3",
                                       draft="/drafts/d", depth=PROPOSER_CHAIN)
    assert m.speculative["num_speculative_tokens"] == 6 and len(found) == 2
    table = schedule_folder(tmp_path, ((1, 7, 4), (8, None, 0)))
    m = parse_method(f"proposer:{copy}+static:3+table:{table}", draft=draft)
    assert env_spec(m) == ProposerSpec(copy=str(copy.resolve()), stopper="static:3",
                                       draft="/drafts/d", depth=PROPOSER_CHAIN,
                                       schedule=str(Path(table).resolve()))
    with pytest.raises(MCSDError, match="no schedule at"):
        parse_method(f"proposer:{copy}+table:{tmp_path / 'none'}")


@pytest.mark.parametrize(("arg", "message"), [
    ("", "use proposer:COPY, proposer:STOPPER or proposer:COPY\\+STOPPER"),
    ("{copy}+", "use proposer:COPY"),
    ("static:3+{copy}", "name the copy length first"),
    ("{copy}+{copy}", "name the copy length first"),
    ("nonsense", "unknown stopper 'nonsense'"),
    ("stopper:{tree}", "vLLM verifies chains"),
])
def test_bad_proposer_methods_name_the_fix(tmp_path, arg, message):
    from mcsd_runtime.serving.vllm_methods import parse_method

    copy = copy_folder(tmp_path)
    tree = chain_stopper(tmp_path, (4, 2, 2, 1))
    with pytest.raises(MCSDError, match=message):
        parse_method("proposer:" + arg.format(copy=copy, tree=tree), draft="/d")
    with pytest.raises(MCSDError, match="drafts with the pair's draft"):
        parse_method("proposer:static:2")


def test_the_eval_records_the_draft_a_proposer_drafts_with(tmp_path):
    from types import SimpleNamespace

    from mcsd_runtime.cli.eval_vllm import _draft_model
    from mcsd_runtime.serving.vllm_methods import parse_method

    copy = copy_folder(tmp_path)
    run = SimpleNamespace(methods=[parse_method("ar"), parse_method(f"proposer:{copy}")])
    assert _draft_model(run) == "-"
    run.methods.append(parse_method(f"proposer:{copy}+static:2", draft="/drafts/d"))
    assert _draft_model(run) == "/drafts/d"
    run.methods.insert(0, parse_method("draft:2", draft="/drafts/export"))
    assert _draft_model(run) == "/drafts/export"


class Logged(SwitchStopper):
    """`switch:0.6:2:3` that logs, into a list its copies share, the trajectory at every
    step's start and the decision features at every depth it is asked about."""

    def __init__(self, log: list) -> None:
        super().__init__(0.6, 2, 3)
        self.log = log

    def should_draft(self, start) -> bool:
        go = super().should_draft(start)
        self.log.append(("start", list(start.trajectory()), go))
        return go

    def should_continue(self, frontier) -> bool:
        self.log.append(("depth", frontier.depth, frontier.decision_features()[0].tolist()))
        return super().should_continue(frontier)


def test_the_class_decides_as_the_decoder_does_step_by_step(monkeypatch, toy_tiny, toy_pair):
    """A whole greedy decode: the class, fed the target's verdicts as vLLM feeds them, asks its
    stopper the same questions with the same features at every step as the toolkit's decoder
    (steps near the budget left out: the decoder drafts no deeper than the tokens left). The
    gate starts closed, so the decoder's first step, from the prompt alone, drafts nothing and
    commits one token, as vLLM's prefill does."""
    from mcsd_runtime.decode.decoder import DecodeConfig, MCSDDecoder

    n = 40
    ours: list = []
    cfg = DecodeConfig(k_config=(1,) * K, max_new_tokens=n, eos_token_ids=())
    out = MCSDDecoder(toy_pair, cfg, stopper=Logged(ours)).generate(PROMPT)
    theirs: list = []
    p = proposer(monkeypatch, toy_tiny)
    p.stopper = Logged(theirs)
    tokens, t, sampled = out.token_ids, 1, [out.token_ids[0]]
    while t < n - K - 1:
        draft = step(p, [PROMPT + tokens[:t]], [sampled])[0]
        accepted = common_prefix(draft, tokens[t:])
        sampled = tokens[t : t + accepted + 1]
        t += len(sampled)
    ours = ours[1:]  # the decoder's first step, from the prompt alone, is vLLM's prefill
    seen = len(theirs)
    assert sum(kind == "start" for kind, *_ in ours[:seen]) > 8
    assert any(not e[2] for e in ours[:seen] if e[0] == "start")  # the gate closed...
    assert any(e[2] for e in ours[:seen] if e[0] == "start")  # ...and opened
    for a, b in zip(ours[:seen], theirs, strict=True):
        assert a[:2] == b[:2] or (a[0] == b[0] == "start" and a[2] == b[2])
        assert np.allclose(a[-1] if a[0] == "depth" else a[1],
                           b[-1] if b[0] == "depth" else b[1], atol=1e-4), (a, b)
