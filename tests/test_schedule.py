"""K by batch size: the `Schedule` table and its checks, the engine profile's interpolation, and
`mcsd train --decision schedule` on synthetic traces whose right answer is known."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pandas as pd
import pytest

from mcsd_runtime.errors import MCSDError
from mcsd_runtime.serving.engine_profile import EngineProfile, ProfilePoint
from mcsd_runtime.serving.schedule import FILE, Band, Schedule, check_bands

# ------------------------------------------------------------------ the table


@pytest.mark.parametrize(("bands", "message"), [
    ([[1, 8, 4], [5, 16, 2]],
     "bands 1-8 (K=4) and 5-16 (K=2) overlap at batch sizes 5-8: start 5-16 at 9 or end 1-8 "
     "at 4"),
    ([[1, 8, 4], [12, None, 2]],
     "batch sizes 9-11 lie between bands 1-8 and 12+ and have no K: start 12+ at 9 or end 1-8 "
     "at 11"),
    ([[4, 8, 4], [9, None, 2]],
     "the first band starts at batch size 4, not 1, so batch sizes 1-3 have no K: start it "
     "at 1"),
    ([[1, 4, -1], [5, None, 2]], "band 1-4 has K=-1: K is the number of tokens drafted a step, "
                                 "an integer >= 0"),
    ([[1, None, 4], [5, None, 2]], "band 1+ is open-ended but band 5+ follows it: only the last "
                                   "band may be open (hi null); end 1+ at 4"),
    ([[1, 4]], "band [1, 4] is not [lo, hi, K]"),
    ([[1, 0, 3]], "ends at 0: its end must be an integer >= its start 1"),
    ([], "has no bands"),
    (5, "the bands are int, not a list"),
])
def test_bad_tables_name_the_problem_and_the_fix(bands, message):
    with pytest.raises(MCSDError) as err:
        Schedule(bands)
    assert message in str(err.value)


def test_bands_are_sorted_and_k_for_reads_them():
    s = Schedule([[5, 15, 2], [16, None, 0], [1, 4, 4]])
    assert s.bands == (Band(1, 4, 4), Band(5, 15, 2), Band(16, None, 0))
    assert [s.k_for(b) for b in (1, 4, 5, 15, 16, 10_000)] == [4, 4, 2, 2, 0, 0]
    assert s.max_k == 4
    with pytest.raises(MCSDError, match="a batch size is an integer >= 1"):
        s.k_for(0)


def test_categories_fall_back_to_the_pooled_bands():
    s = Schedule([[1, None, 2]], {"code": [[1, 3, 6], [4, None, 1]]})
    assert (s.k_for(2, "code"), s.k_for(9, "code")) == (6, 1)
    assert s.k_for(2, "chat") == s.k_for(2) == s.k_for(2, None) == 2
    assert s.max_k == 6
    with pytest.raises(MCSDError, match="category 'chat': the first band starts at batch size 2"):
        Schedule([[1, None, 2]], {"chat": [[2, None, 1]]})


def test_a_finite_last_band_refuses_batch_sizes_above_it():
    s = Schedule([[1, 8, 3]])
    assert s.k_for(8) == 3
    with pytest.raises(MCSDError, match="batch size 9 is above the schedule's last band 1-8: end "
                                        "that band at null"):
        s.k_for(9)


def test_the_artifact_round_trips_and_bad_files_are_refused(tmp_path):
    s = Schedule([[1, 3, 5], [4, None, 1]], {"code": [[1, None, 7]]}, {"engine": "vllm"},
                 {"groups": {}})
    path = s.write(tmp_path)
    assert path == tmp_path / FILE
    data = json.loads(path.read_text())
    assert data["format"] == "mcsd-schedule" and data["bands"] == [[1, 3, 5], [4, None, 1]]
    assert "[1, 3, 5]" in path.read_text()  # a band on one line
    back = Schedule.load(tmp_path)
    assert back == s and back.meta == {"engine": "vllm"} and back.report == {"groups": {}}
    assert Schedule.load(path) == s
    path.write_text("{not json")
    with pytest.raises(MCSDError, match="is not readable JSON"):
        Schedule.load(tmp_path)
    path.write_text(json.dumps({"format": "mcsd-decision", "bands": []}))
    with pytest.raises(MCSDError, match="is not a schedule"):
        Schedule.load(path)
    path.write_text(json.dumps({"format": "mcsd-schedule", "version": 9, "bands": []}))
    with pytest.raises(MCSDError, match="version 9 of mcsd-schedule; this release reads version 1"):
        Schedule.load(path)
    with pytest.raises(MCSDError, match="no schedule at"):
        Schedule.load(tmp_path / "absent")


def test_check_bands_names_where():
    with pytest.raises(MCSDError, match="^my table: the first band"):
        check_bands([[2, None, 1]], "my table")


# ------------------------------------------------------------------ the engine profile


def profile_json(points, **kw) -> dict:
    return {"format": "mcsd-engine-profile", "version": 1, "engine": "vllm",
            "engine_version": "0.32.0", "model": "m", "dtype": "float32", "method": "ngram",
            "points": points} | kw


def test_step_seconds_interpolates_in_concurrency_and_clamps():
    points = [{"concurrency": c, "k": k, "step_seconds": s, "steps": 50}
              for c, k, s in ((1, 0, 0.010), (8, 0, 0.024), (1, 2, 0.012), (4, 2, 0.030))]
    p = EngineProfile.from_json(profile_json(points))
    assert p.ks == (0, 2) and p.concurrencies == (1, 4, 8)
    assert p.step_seconds(1, 0) == pytest.approx(0.010)
    assert p.step_seconds(4.5, 0) == pytest.approx(0.017)  # halfway from 1 to 8
    assert p.step_seconds(2, 2) == pytest.approx(0.018)  # a third of the way from 1 to 4
    assert p.step_seconds(64, 2) == pytest.approx(0.030)  # held beyond the last point
    with pytest.raises(MCSDError, match=r"no step time at K=3 \(it measured K=0, 2\): measure "
                                        r"K=3 with `mcsd profile --engine vllm`"):
        p.step_seconds(1, 3)


def test_the_profile_round_trips_and_refuses_bad_points(tmp_path):
    p = EngineProfile("vllm", "0.32.0", "m", "bf16", "draft",
                      (ProfilePoint(4, 1, 0.02, 10), ProfilePoint(1, 1, 0.01, 10)))
    assert [pt.concurrency for pt in p.points] == [1, 4]  # sorted
    assert EngineProfile.load(p.save(tmp_path / "p.json")) == p
    one = {"concurrency": 1, "k": 0, "step_seconds": 0.01, "steps": 5}
    cases = [(profile_json([one, one]), "measures concurrency 1 at K=0 twice"),
             (profile_json([one | {"step_seconds": -1}]), "step_seconds must be a positive"),
             (profile_json([one | {"k": -1}]), "k an integer >= 0"),
             (profile_json([{"k": 0}]), "lacks one of concurrency"),
             (profile_json([]), "has no points"),
             (profile_json([one], format="mcsd-cost-profile"), "is not an engine profile")]
    for data, message in cases:
        with pytest.raises(MCSDError, match=message):
            EngineProfile.from_json(data)


def test_plain_points_round_trip_interpolate_and_are_optional(tmp_path):
    """The engine without speculation: one point per concurrency, no K, read back as written;
    a profile without them (older ones) reads, and says it has none."""
    one = {"concurrency": 1, "k": 0, "step_seconds": 0.01, "steps": 5}
    plain = [{"concurrency": 8, "step_seconds": 0.03, "steps": 9},
             {"concurrency": 1, "step_seconds": 0.01, "steps": 9}]
    p = EngineProfile.from_json(profile_json([one], plain=plain))
    assert [pt.concurrency for pt in p.plain] == [1, 8]
    assert p.plain_step_seconds(4.5) == pytest.approx(0.02) and p.plain_step_seconds(16) == 0.03
    saved = json.loads(p.save(tmp_path / "p.json").read_text())
    assert saved["plain"] == sorted(plain, key=lambda q: q["concurrency"])  # no "k" written
    assert EngineProfile.load(tmp_path / "p.json") == p
    bare = EngineProfile.from_json(profile_json([one]))
    assert bare.plain == () and bare.plain_step_seconds(1) is None
    assert "plain" not in bare.to_json()
    for bad, message in ((plain + plain[:1], "one point per concurrency"),
                         ([{"concurrency": 1, "step_seconds": 0.01}], "lacks one of"),
                         ({"concurrency": 1}, "must be a list")):
        with pytest.raises(MCSDError, match=message):
            EngineProfile.from_json(profile_json([one], plain=bad))


def test_points_out_of_line_are_suspects():
    """A step cheaper at more requests or more drafted tokens, past the slack, names both
    points; a profile in order names none."""
    from mcsd_runtime.serving.vllm_profile import suspects

    def points(table: dict) -> dict:
        return {key: ProfilePoint(*key, s, 10) for key, s in table.items()}

    ordered = {(1, 0): 1.0, (1, 1): 1.1, (4, 0): 1.05, (4, 1): 1.6}
    assert suspects(points(ordered)) == []
    assert suspects(points(ordered | {(1, 1): 1.2 * 1.6})) == [(1, 1), (4, 1)]  # in c
    assert suspects(points(ordered | {(4, 0): 2.0})) == [(4, 0), (4, 1)]  # in K
    assert suspects(points(ordered | {(1, 1): 1.14 * 1.05 * 1.0})) == []  # within 15%


# ------------------------------------------------------------------ training on traces

CONCURRENCIES = (1, 4, 16, 64)


def steep_profile(path: Path, ks=range(9)) -> Path:
    """Step time flat in K at one request, and growing steeply with c * K (as a batch leaves
    the memory-bound regime): 10 ms * (1 + (c K / 16)^2)."""
    points = [{"concurrency": c, "k": k, "step_seconds": 0.01 * (1 + (c * k / 16) ** 2),
               "steps": 100} for c in CONCURRENCIES for k in ks]
    path.write_text(json.dumps(profile_json(points)))
    return path


def write_traces(folder: Path, rows: list[dict]) -> Path:
    """An engine trace folder: its manifest and one Parquet file of `rows`."""
    folder.mkdir(parents=True)
    (folder / "manifest.json").write_text(json.dumps({"kind": "engine-trace"}))
    pd.DataFrame(rows).to_parquet(folder / "steps.parquet")
    return folder


def trace_rows(prompts: int, accepted, category=None, drafted: int = 8, steps: int = 20,
               prefix: str = "p", method: str = "ngram") -> list[dict]:
    """`steps` steps of each prompt, drafting `drafted` of K=8 and accepting `accepted(step)`."""
    return [{"run_id": "r", "request_id": f"{prefix}{i}", "prompt_id": f"{prefix}{i}",
             "category": category, "step": s, "drafted": drafted, "accepted": accepted(s),
             "batch_size": 4, "engine": "vllm", "method": method, "num_spec_tokens": 8}
            for i in range(prompts) for s in range(steps)]


@pytest.fixture
def traces_reader(monkeypatch):
    """`collect.traces.load_traces` reading the Parquet file of `write_traces` (the real reader
    is another module's; this one has its columns)."""
    module = types.ModuleType("collect.traces")
    module.load_traces = lambda folder: pd.read_parquet(Path(folder) / "steps.parquet")
    monkeypatch.setitem(sys.modules, "collect.traces", module)


def train(tmp_path: Path, runs: list[Path], profile: Path, *more: str) -> tuple[int, Path]:
    from mcsd_runtime.cli import main

    out = tmp_path / "schedule"
    code = main(["train", "--decision", "schedule", "--runs", *map(str, runs),
                 "--cost-profile", str(profile), "--out", str(out), *more])
    return code, out


def test_high_acceptance_drafts_long_alone_and_not_at_all_when_steps_grow_steeply(
        tmp_path, traces_reader, capsys):
    runs = write_traces(tmp_path / "traces", trace_rows(10, lambda s: 8))
    code, out = train(tmp_path, [runs], steep_profile(tmp_path / "p.json"))
    assert code == 0, capsys.readouterr().err
    s = Schedule.load(out)
    # every draft accepted and a flat step at c=1: the longest K; at c=64, a K of 1 already
    # costs 17 steps' time: none
    assert s.bands == (Band(1, 3, 8), Band(4, 15, 3), Band(16, 63, 0), Band(64, None, 0))
    assert s.meta["engine"] == "vllm" and s.meta["method"] == "ngram"
    band = s.report["groups"]["all"]["bands"][0]
    assert band["tokens_per_s"] == pytest.approx(1 * (1 + 8) / 0.0125)  # c (1 + K) / step
    assert band["no_spec_tokens_per_s"] == pytest.approx(1 / 0.01)
    assert "8" in capsys.readouterr().out


def test_the_report_sets_each_band_beside_the_single_k_and_no_speculation(
        tmp_path, traces_reader, capsys):
    runs = write_traces(tmp_path / "traces", trace_rows(10, lambda s: 8))
    code, out = train(tmp_path, [runs], steep_profile(tmp_path / "p.json"))
    assert code == 0
    report = json.loads((out / "report.json").read_text())
    assert report["prompts"] == {"val": 7, "test": 3}
    group = report["groups"]["all"]
    single = group["single_k"]
    for band in group["bands"]:
        assert band["single_k"] == single
        for key in ("tokens_per_s", "single_k_tokens_per_s", "no_spec_tokens_per_s"):
            assert band[key] > 0
        assert band["tokens_per_s"] >= band["single_k_tokens_per_s"] - 1e-9
        assert band["tokens_per_s"] >= band["no_spec_tokens_per_s"] - 1e-9
    assert max(b["vs_single_k"] for b in group["bands"]) > 1.5  # one K loses somewhere
    md = (out / "report.md").read_text()
    assert f"single K (K={single})" in md and "| 1-3 | 8 | 720.0 |" in md
    assert report["acceptance"]["all"]["test"]["8"] == {"mean_accepted": 8.0, "steps": 60}
    assert json.loads((out / FILE).read_text())["report"] == report


def test_a_profiled_plain_engine_is_reported_and_bands_below_it_are_named(
        tmp_path, traces_reader, capsys):
    """With the engine without speculation in the profile, each band sets its speed beside
    plain's, and a band replayed below plain (K=0's speculative path costing more than plain
    at 64) gets a note; without it, no such column."""
    runs = write_traces(tmp_path / "traces", trace_rows(10, lambda s: 8))
    data = json.loads(steep_profile(tmp_path / "p.json").read_text())
    # plain: as fast as K=0 up to 16 requests, a third faster at 64
    data["plain"] = [{"concurrency": c, "step_seconds": 0.01 / (1.5 if c == 64 else 1),
                      "steps": 100} for c in CONCURRENCIES]
    (tmp_path / "plain.json").write_text(json.dumps(data))
    code, out = train(tmp_path, [runs], tmp_path / "plain.json")
    assert code == 0, capsys.readouterr().err
    bands = json.loads((out / "report.json").read_text())["groups"]["all"]["bands"]
    assert [b["k"] for b in bands] == [8, 3, 0, 0]
    assert bands[0]["plain_tokens_per_s"] == pytest.approx(100.0)
    assert bands[0]["vs_plain"] == pytest.approx(bands[0]["tokens_per_s"] / 100)
    assert bands[-1]["vs_plain"] == pytest.approx(1 / 1.5)
    printed = capsys.readouterr().out
    assert "all, batch sizes 64+: K=0 replays at 0.667x the engine without speculation" in printed
    assert printed.count("the engine without speculation") == 1  # 16-63: plain = K=0, no note
    assert "| vs plain |" in (out / "report.md").read_text()
    code, bare = train(tmp_path / "b", [runs], steep_profile(tmp_path / "b.json"))
    assert "vs_plain" not in json.loads((bare / "report.json").read_text())["groups"]["all"][
        "bands"][0] and "vs plain" not in (bare / "report.md").read_text()


def test_schedule_json_is_written_last(tmp_path, traces_reader, monkeypatch):
    runs = write_traces(tmp_path / "traces", trace_rows(6, lambda s: 3))
    seen = []
    write = Schedule.write

    def watched(self, folder):
        seen.append(sorted(p.name for p in Path(folder).iterdir()))
        return write(self, folder)

    monkeypatch.setattr(Schedule, "write", watched)
    code, out = train(tmp_path, [runs], steep_profile(tmp_path / "p.json"))
    assert code == 0 and seen == [["report.json", "report.md"]]
    assert sorted(p.name for p in out.iterdir()) == ["report.json", "report.md", FILE]


def test_categories_get_bands_of_their_own(tmp_path, traces_reader, capsys):
    rows = (trace_rows(8, lambda s: 8, "code", prefix="c")
            + trace_rows(8, lambda s: 0, "chat", prefix="t")
            + trace_rows(2, lambda s: 8, "rare", prefix="r"))
    runs = write_traces(tmp_path / "traces", rows)
    code, out = train(tmp_path, [runs], steep_profile(tmp_path / "p.json"), "--batch-size",
                      "1,16")
    assert code == 0, capsys.readouterr().err
    s = Schedule.load(out)
    assert set(s.categories) == {"chat", "code"}  # "rare" has too few prompts: pooled
    assert s.categories["code"] == (Band(1, 15, 8), Band(16, None, 0))
    assert s.categories["chat"] == (Band(1, 15, 0), Band(16, None, 0))  # nothing accepted
    assert s.k_for(1, "rare") == s.k_for(1)


def test_short_drafts_tell_about_longer_ks_only_when_not_cut_by_k(tmp_path):
    from train.schedule.acceptance import Estimate, expected_accepted, trace_steps

    rows = (trace_rows(1, lambda s: 2, drafted=2, steps=4)  # n-gram ran out: any K drafts 2
            + trace_rows(1, lambda s: 4, drafted=4, steps=4, prefix="q"))
    rows[-1]["num_spec_tokens"] = 4  # ... but this one was cut at K=4
    steps = trace_steps(pd.DataFrame(rows))
    assert expected_accepted(steps, 2) == Estimate(2.0, 8, drafted=2.0)
    est = expected_accepted(steps, 6)  # 4 short steps, the 3 of 4 not cut, accepting 4
    assert est.steps == 7 and est.accepted == pytest.approx((4 * 2 + 3 * 4) / 7)
    assert est.drafted == pytest.approx((4 * 2 + 3 * 4) / 7)  # each drafted all it could


def test_bad_traces_are_refused():
    from train.schedule.acceptance import trace_steps

    with pytest.raises(MCSDError, match=r"lacks columns \['accepted'\]"):
        trace_steps(pd.DataFrame({"prompt_id": ["a"], "drafted": [3]}))
    with pytest.raises(MCSDError, match="1 step\\(s\\) accept fewer than 0 or more than they "
                                        "drafted"):
        trace_steps(pd.DataFrame({"prompt_id": ["a"], "drafted": [3], "accepted": [4]}))


def test_a_dense_chain_collection_is_read_and_a_tree_refused(tmp_path, monkeypatch):
    import collect
    from train.schedule.acceptance import collection_steps

    rows = pd.DataFrame({"run_id": "r", "prompt_id": "a", "prompt_hash": "h",
                         "step": [0, 0, 0, 1, 1, 1], "accepted_length": [2, 2, 2, 0, 0, 0],
                         "drafted_depth": 3})
    monkeypatch.setattr(collect, "load_rows", lambda run, columns: rows[columns], raising=False)
    manifest = {"format": "mcsd-collect-run", "k_config": "1,1,1", "row_schema_version": 2}
    steps = collection_steps(tmp_path, manifest)
    assert steps[["prompt", "drafted", "accepted", "cap"]].values.tolist() == [
        ["h", 3, 2, 3], ["h", 3, 0, 3]]  # one row a step; it tells about K <= 3 only
    with pytest.raises(MCSDError, match="--k-config 4,1,1: a schedule replays chains"):
        collection_steps(tmp_path, manifest | {"k_config": "4,1,1"})


@pytest.mark.parametrize(("profile_ks", "more", "message"), [
    (range(1, 9), [], "has no K=0 (no speculation) points"),
    (range(9), ["--max-k", "0"], "--max-k 0: the largest K tried must be >= 1"),
    (range(9), ["--check-prompts", "4"], "--decision schedule has no --check-prompts"),
])
def test_train_refuses_what_it_cannot_replay(profile_ks, more, message, tmp_path,
                                             traces_reader, capsys):
    runs = write_traces(tmp_path / "traces", trace_rows(4, lambda s: 1))
    code, out = train(tmp_path, [runs], steep_profile(tmp_path / "p.json", profile_ks), *more)
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err
    assert not out.exists()


def test_traces_of_another_method_than_the_profile_are_refused(tmp_path, traces_reader, capsys):
    runs = write_traces(tmp_path / "traces", trace_rows(4, lambda s: 1, method="eagle3"))
    code, out = train(tmp_path, [runs], steep_profile(tmp_path / "p.json"))
    assert code == 2 and "drafted by eagle3, but the profile measured ngram" in \
        capsys.readouterr().err


def test_traces_written_by_the_trace_writer_train_a_schedule(tmp_path, capsys):
    """The real reader and writer of trace folders (`collect.traces`), across two runs that
    traced the same prompts: a prompt is one prompt by its hash, in one split."""
    traces = pytest.importorskip("collect.traces")
    runs = []
    for run in ("a", "b"):
        rows = [r | {"run_id": run, "prompt_hash": f"h{r['prompt_id']}"}
                for r in trace_rows(6, lambda s: s % 5, "code")]
        traces.write_traces(tmp_path / run, rows, {"engine": "vllm", "source": "test"})
        runs.append(tmp_path / run)
    code, out = train(tmp_path, runs, steep_profile(tmp_path / "p.json"), "--batch-size", "1,64")
    assert code == 0, capsys.readouterr().err
    report = json.loads((out / "report.json").read_text())
    assert report["prompts"] == {"val": 4, "test": 2}  # 6 prompts, not 12
    assert report["acceptance"]["all"]["test"]["8"]["steps"] == 2 * 2 * 20
    assert Schedule.load(out).bands[-1] == Band(64, None, 0)


def test_a_step_is_priced_by_what_its_requests_draft():
    """An n-gram drafter that finds a match on one step in ten drafts K there and nothing
    elsewhere: a step costs the profile's time at the mean drafted tokens, not at K."""
    import pandas as pd

    from mcsd_runtime.serving.engine_profile import EngineProfile, ProfilePoint
    from train.schedule.acceptance import expected_accepted

    steps = pd.DataFrame({"drafted": [4] + [0] * 9, "accepted": [4] + [0] * 9,
                          "cap": [4] * 10})
    e = expected_accepted(steps, 4)
    assert (e.accepted, e.drafted, e.steps) == (0.4, 0.4, 10)
    assert expected_accepted(steps, 2).drafted == 0.2
    profile = EngineProfile("vllm", "0.32.0", "m", "float32", "ngram", tuple(
        ProfilePoint(4, k, 0.1 * (1 + k), 10) for k in range(5)))
    assert profile.step_seconds_drafting(4, 0.4) == pytest.approx(0.14)
    assert profile.step_seconds_drafting(4, 4) == profile.step_seconds(4, 4)
    with pytest.raises(MCSDError, match="outside the profile's K=0..4"):
        profile.step_seconds_drafting(4, 5)
