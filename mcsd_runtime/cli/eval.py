"""`mcsd eval`: every method on the same prompts in one process, interleaved prompt by prompt
(the order rotates) after a warm-up, so machine drift cancels out. Writes per-prompt records,
a summary (CSV, JSON, Markdown), plots and a report.

Methods (comma-separated; a k-config's commas are kept with its method):
  ar                     the target alone, autoregressive, through our decoder's loop
  hf                     the target's own generate(): an AR reference sharing no code with ours
  hf-static[:MODE]       generate() on a static cache, its decode step compiled (MODE compile)
                         or not (eager); by default compiled on CUDA only. Compiled, each new
                         cache size gets one untimed generate() before the timed ones
  mcsd[:K]               static MCSD with k-config K (default --k-config)
  mcsd-target-init[:K]   the paper's target-initialized candidates (NOT lossless)
  static:S confidence:T entropy[:L[:G]] cumprod:T heuristic
                         MCSD with --k-config and that stopper
  stopper:PATH           MCSD with --k-config and a trained stopper artifact
  lookup[:K[:N]]         prompt lookup: where the context's last N..4 tokens occurred before,
                         verify the K tokens that followed (no draft forward), else the target
                         alone (defaults 8, 3); lookup:K:N+STOPPER drafts with --k-config and
                         STOPPER (any of the above) where nothing is copied
  lookup-learned:PATH    prompt lookup with a learned copy length (`mcsd train --decision
                         copy`): how many of the match's tokens to verify, if any, each step;
                         lookup-learned:PATH+STOPPER (a policy trained with a --k-config)
                         copies or lets STOPPER draft with --k-config, whichever pays
  width:PATH             a learned width (`mcsd train --decision width`): the first depth of
                         --k-config, verifying as many of its candidates as pay, step by
                         step; also as STOPPER after lookup:K:N+ or lookup-learned:PATH+
  hf-assisted            transformers' generate(assistant_model=draft), its default schedule
  hf-generate:STOPPER    our decoder inside generate(custom_generate=integrations.hf.generate)
                         with --k-config and that stopper (e.g. hf-generate:heuristic), paired
                         with the same stopper run directly when both are listed

--k-config defaults to the tree the trained stoppers among the methods were trained on (else
4,2,2,1). Each method is reported under a label with its defaults spelt out (confidence ->
confidence:0.4, mcsd -> mcsd:4,2,2,1).

Several prompt sets (`--prompts toy-code,pkg-code,pkg-prose,toy-shift`) give one interleaved
run per set, each in its own subfolder, and a table across domains (domains.md): every method
against ar, against the static schedule a user would deploy (--deploy; by default the one a
listed stopper recorded from its training collection), against each domain's hindsight best
static schedule and against the tuned heuristic (--heuristic), and each method's worst domain.
A set whose prompts carry two or more categories (`--prompts spec-bench=question.jsonl`,
`inst-mix-eval`, `mt-bench`) is split the same way into one domain per category, --limit
prompts each (--no-by-category keeps it one domain).

Prompts reach the model as --chat says: by default (auto) instruction prompts (benchmarks,
Spec-Bench, inst-* sets) inside the tokenizer's chat template when it has one, text prompts
(code, prose) raw. A trained stopper records how its training prompts were formatted; one
evaluated on prompts formatted otherwise is refused (--allow-format-mismatch runs it anyway).

`--drafts toy,toy-draft:l2,toy-draft:l4` runs every method that uses a draft once per draft
(METHOD@DRAFT), interleaved with one ar, and writes drafts.md: τ, speedups and quality per
domain, method and draft (`mcsd toy draft --list` lists the toy pair's extra drafts).

Every output is scored after the timed runs, with one teacher-forced target forward: the
target's NLL per new token (in greedy runs a lossless method's equals ar's), the share of its
tokens that are the target's top-1, and its share of repeated 4-grams.

Greedy runs report output equality with ar and with hf; where a lossless output differs from
hf's, the report gives the first differing position and the target's top-2 logit margin there.
"""

from __future__ import annotations

import argparse
import functools
import time
from pathlib import Path
from typing import TYPE_CHECKING

from mcsd_runtime.cli.args import (
    FROM_STOPPER,
    add_batch_size_arg,
    add_decode_args,
    add_format_mismatch_arg,
    add_limit_arg,
    add_out_arg,
    add_pair_args,
    add_prompts_arg,
    add_runs_arg,
    add_threads_arg,
    apply_threads,
    check_batch_size,
    decode_config_from_args,
    pair_from_args,
)
from mcsd_runtime.cli.eval_vllm import add_vllm_args
from mcsd_runtime.constants import DEFAULT_K_CONFIG
from mcsd_runtime.errors import MCSDError
from mcsd_runtime.extras import require_toolkit
from mcsd_runtime.prompts.chat import add_chat_arg

if TYPE_CHECKING:
    from mcsd_runtime.evaluate.multi_draft import DraftsRun

DEFAULT_METHODS = "ar,hf,mcsd,mcsd-target-init,confidence,heuristic,hf-assisted"
# A first try in about a minute on the tiny toy pair (a few on the default one); `make demo`
# and the README's results pass their own sizes.
DEFAULT_LIMIT = 16
DEFAULT_MAX_NEW_TOKENS = 64


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("eval", help="evaluate methods and stoppers end to end",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_pair_args(p)
    add_decode_args(p, k_config=FROM_STOPPER)
    p.set_defaults(max_new_tokens=DEFAULT_MAX_NEW_TOKENS)
    add_prompts_arg(p, "prompt set or file, or several separated by commas for an evaluation "
                       "across domains (default %(default)s; `mcsd prompts --list`)",
                    default="toy-code")
    add_limit_arg(p, "number of prompts per set, a seeded sample (default %(default)s; 0: all)",
                  default=DEFAULT_LIMIT)
    p.add_argument("--methods", default=DEFAULT_METHODS,
                   help="comma-separated, see above; each runs under a label with its defaults "
                        "spelt out, e.g. confidence -> confidence:0.4 (default: %(default)s)")
    p.add_argument("--reference", default=None,
                   help="method every other is compared with (paired per-prompt geometric mean "
                        "and 95%% CI); default: the run's best static schedule (mcsd[:K], "
                        "static:D, lookup:K:N or lookup:K:N+static:D) by its geometric-mean "
                        "speedup over ar")
    p.add_argument("--deploy", default=None, metavar="METHOD",
                   help="across domains: the static schedule a user would deploy; default: the "
                        "deploy_static recorded by the first listed stopper:PATH (added to the "
                        "methods if missing)")
    p.add_argument("--heuristic", default=None, metavar="METHOD",
                   help="across domains: the tuned heuristic to compare with; default: the first "
                        "listed heuristic method")
    add_runs_arg(p, "build the table across domains from finished eval folders (one per "
                    "domain, e.g. run in parallel) instead of decoding; writes to --out",
                 metavar="EVAL_DIR")
    p.add_argument("--drafts", default=None, metavar="D1,D2,...",
                   help="run every method that uses a draft once per draft (labelled "
                        "METHOD@DRAFT; ar and hf once), all interleaved, and write drafts.md: "
                        "τ, speedup and quality per domain, method and draft (e.g. "
                        "toy,toy-draft:l2,toy-draft:l4); --reference then means the first "
                        "draft's")
    add_chat_arg(p)
    add_format_mismatch_arg(p)
    p.add_argument("--by-category", action=argparse.BooleanOptionalAction, default=None,
                   help="one domain per category of a categorized prompt set (default: when "
                        "its prompts carry two or more categories, as a Spec-Bench file does)")
    add_out_arg(p, "output folder (default: $MCSD_DATA/runs/eval-<time>, MCSD_DATA defaulting "
                   "to ./data); an existing one has its reports replaced")
    add_batch_size_arg(p, "sequences decoded together (MCSDDecoder.generate_batch; default "
                          "%(default)s): every method decodes the same batches of consecutive "
                          "prompts, batch by batch in a rotating order; speed is the batch's "
                          "committed tokens per decode second, paired per batch (the default "
                          "methods then leave out those that decode one sequence at a time: hf, "
                          "hf-assisted, mcsd-target-init). Several, e.g. 1,4,8,16: one run per "
                          "batch size and a table across them (batches.md)", several=True)
    p.add_argument("--samples", type=int, default=1, metavar="N",
                   help="at --temperature > 0: decode every prompt N times with every method "
                        "(seeds --seed, --seed+1, ...), speed paired per prompt over all its "
                        "samples; one sampled output's length in steps varies too much for a "
                        "comparison on a few prompts (default %(default)s)")
    add_threads_arg(p)
    add_vllm_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    require_toolkit("mcsd eval", "matplotlib", "pandas")  # its tables and plots
    if args.engine == "vllm":
        from mcsd_runtime.cli.eval_vllm import run as run_vllm

        return run_vllm(args, DEFAULT_METHODS, lambda: (output_folder(args), prompt_domains(args)))
    if args.concurrency != "1":
        raise MCSDError("--concurrency is for --engine vllm; our decoder batches with "
                        "--batch-size")

    from mcsd_runtime.evaluate.loop import check_samples

    apply_threads(args)
    sizes = parse_batch_sizes(args.batch_size)
    args.batch_size = max(sizes)
    methods, k_config, why = _resolve_methods(args)
    base = decode_config_from_args(args, k_config=k_config)
    check_samples(args.samples, base.temperature, args.batch_size)
    if args.samples > 1 and args.drafts is not None:
        raise MCSDError("--samples > 1 is not supported with --drafts: run one draft at a time")
    if args.drafts is not None:  # several drafts: mcsd_runtime.evaluate.multi_draft
        from mcsd_runtime.evaluate.multi_draft import run_drafts

        return run_drafts(drafts_run(args), methods, base, why=why,
                          settings_of=functools.partial(_settings, args, base=base))
    if args.runs:
        return combine_runs(args, methods)
    print(f"k-config {base.k_config} ({why})", flush=True)
    domains = prompt_domains(args)
    if len(sizes) > 1:
        if len(domains) > 1:
            raise MCSDError("give several --batch-size values or several domains (prompt sets, "
                            "or a set's categories), not both: run one evaluation per domain "
                            "(--no-by-category keeps a categorized set one domain)")
        return run_batch_sizes(args, methods, base, sizes, domains)
    if len(domains) > 1:
        return run_domains(args, methods, base, domains)
    return run_domain(args, methods, base, domains)


def drafts_run(args: argparse.Namespace) -> DraftsRun:
    """The `multi_draft.DraftsRun` of `--drafts` and the options it takes (MCSDError for those
    it refuses: --runs, --draft, --batch-size above 1)."""
    from mcsd_runtime.evaluate.multi_draft import DraftsRun, split_drafts

    if args.runs:
        raise MCSDError("--drafts decodes; --runs only combines finished runs: pass one")
    drafts = split_drafts(args.drafts)
    if args.draft is not None:
        raise MCSDError(f"--draft {args.draft} and --drafts: list every draft in --drafts")
    if args.batch_size != 1:
        raise MCSDError("--drafts decodes one sequence at a time (mcsd-target-init has no "
                        "batches): drop --batch-size")
    return DraftsRun(target=args.target, drafts=tuple(drafts), prompts=args.prompts,
                     out=args.out, limit=args.limit or None, seed=args.seed,
                     by_category=args.by_category, device=args.device, dtype=args.dtype,
                     attention=args.attention, chat=args.chat,
                     allow_format_mismatch=args.allow_format_mismatch,
                     reference=args.reference)


def _resolve_methods(args: argparse.Namespace) -> tuple[list[str], tuple[int, ...], str]:
    """The methods of --methods, each labelled with its defaults spelt out, the tree they
    decode with and why (see --help); --reference, --deploy and --heuristic renamed to the
    labels of the methods they name. MCSDError for an unknown method, a --reference not among
    them, or a method that cannot decode at --batch-size."""
    from mcsd_runtime.evaluate.methods import (
        SINGLE_SEQUENCE,
        check_batch_methods,
        check_method,
        explicit_label,
        explicit_methods,
        split_methods,
        tree_for,
    )

    given = split_methods(args.methods)
    if args.batch_size > 1 and args.methods == DEFAULT_METHODS:
        given = [m for m in given if m not in SINGLE_SEQUENCE]
    for m in given:
        check_method(m)
    k_config, why = tree_for(given, args.k_config, DEFAULT_K_CONFIG)
    methods = explicit_methods(given, k_config)
    for option in ("reference", "deploy", "heuristic"):  # named as given, or as labelled
        name = getattr(args, option)
        if name is not None:
            setattr(args, option, methods[given.index(name)] if name in given
                    else explicit_label(name, k_config))
    if args.reference is not None and args.reference not in methods:
        raise MCSDError(f"--reference {args.reference!r} is not among --methods; add it there")
    check_batch_methods(methods, args.batch_size)
    return methods, k_config, why


def run_domain(args: argparse.Namespace, methods: list[str], base,
               domains: dict[str, tuple[str, list]]) -> int:
    """One interleaved run on the one domain of `domains`, written to --out with its summary
    printed."""
    from mcsd_runtime.evaluate.eval_report import markdown_notes, short_table, write_outputs
    from mcsd_runtime.evaluate.loop import run_eval
    from mcsd_runtime.evaluate.stats import summarize
    from mcsd_runtime.evaluate.training_results import stopper_lines, stopper_results

    ((spec, prompts),) = domains.values()
    out = output_folder(args)
    pair = _pair(args, methods)
    fmt = check_formats(args, methods, pair, {spec: prompts})[spec]
    print(f"{len(methods)} methods x {len(prompts)} prompts x {base.max_new_tokens} tokens"
          + (f" x {args.samples} samples" if args.samples > 1 else ""), flush=True)
    records = run_eval(pair, prompts, methods, base, chat=args.chat, batch_size=args.batch_size,
                       samples=args.samples)
    rows = summarize(records, greedy=base.temperature == 0, reference=args.reference)
    settings = _settings(args, pair, base, args.prompts, len(prompts), fmt)
    stoppers = stopper_results(methods)
    replaced = write_outputs(records, rows, out, settings, tokenizer=pair.tokenizer,
                             stoppers=stoppers)
    print(short_table(rows))
    for line in stopper_lines(stoppers):
        print(line)
    notes = markdown_notes(rows, records)
    if notes:
        print(f"\n{notes}")
    if replaced:
        print(f"\nreplaced the earlier {', '.join(replaced)} in {out}")
    print(f"\nwrote {out}/report.md (every column, a legend, plots)")
    return 0


def _pair(args: argparse.Namespace, methods: list[str]):
    """The pair the methods decode with: the target alone where none of them drafts."""
    from mcsd_runtime.evaluate.methods import needs_draft

    return pair_from_args(args, draft_needed=needs_draft(methods))


def prompt_domains(args: argparse.Namespace) -> dict[str, tuple[str, list]]:
    """The domains of `--prompts` (name -> (spec, prompts), none empty; see --help): one per
    set, a categorized set one per category (`--by-category`), each a --limit sample."""
    from mcsd_runtime.prompts.sets import load_domains

    domains = load_domains(args.prompts, limit=args.limit or None, seed=args.seed,
                           by_category=getattr(args, "by_category", None))
    for name, (_, prompts) in domains.items():
        if not prompts:
            raise MCSDError(f"the prompt set {name!r} is empty")
    return domains


def output_folder(args: argparse.Namespace) -> Path:
    """`--out` (default $MCSD_DATA/runs/eval-<time>), checked writable before any model loads."""
    from mcsd_runtime.evaluate.eval_report import check_writable
    from mcsd_runtime.paths import runs_dir

    out = args.out or runs_dir() / time.strftime("eval-%Y%m%d-%H%M%S")
    check_writable(out)
    return out


def check_formats(args: argparse.Namespace, methods: list[str], pair,
                  domains: dict[str, list]) -> dict[str, dict]:
    """Each domain's prompt format under --chat (name -> format), after refusing a trained
    stopper trained on prompts formatted otherwise (--allow-format-mismatch: a warning)."""
    from mcsd_runtime.evaluate.methods import check_prompt_formats

    return check_prompt_formats(methods, domains, pair.tokenizer, args.chat,
                                getattr(args, "allow_format_mismatch", False),
                                log=lambda line: print(line, flush=True))


def parse_batch_sizes(text: str) -> list[int]:
    """`--batch-size`: one count or several, comma-separated, each >= 1."""
    try:
        sizes = [int(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        raise MCSDError(f"--batch-size {text!r}: give counts such as 8 or 1,4,8,16") from None
    if not sizes:
        raise MCSDError("--batch-size: give at least one count")
    for b in sizes:
        check_batch_size(b)
    if len(set(sizes)) != len(sizes):
        raise MCSDError(f"--batch-size {text!r} names a batch size twice")
    return sorted(sizes)


def run_batch_sizes(args: argparse.Namespace, methods: list[str], base, sizes: list[int],
                    domains: dict[str, tuple[str, list]]) -> int:
    """One interleaved run per batch size (subfolders b1, b4, ...) on the one domain of
    `domains`, then the table across batch sizes (batches.md, batches.json)."""
    from mcsd_runtime.evaluate import batch_report
    from mcsd_runtime.evaluate.eval_report import write_outputs
    from mcsd_runtime.evaluate.loop import run_eval
    from mcsd_runtime.evaluate.stats import summarize

    heuristic = args.heuristic or next((m for m in methods if m.startswith("heuristic")), None)
    ((spec, prompts),) = domains.values()
    out = output_folder(args)
    pair = _pair(args, methods)
    fmt = check_formats(args, methods, pair, {spec: prompts})[spec]
    greedy = base.temperature == 0
    by_batch = {}
    for b in sizes:
        print(f"batch size {b}: {len(prompts)} prompts x {len(methods)} methods", flush=True)
        args.batch_size = b
        records = run_eval(pair, prompts, methods, base, chat=args.chat, batch_size=b,
                           batched=True)
        rows = summarize(records, greedy=greedy, reference=args.reference)
        write_outputs(records, rows, out / f"b{b}",
                      _settings(args, pair, base, args.prompts, len(prompts), fmt),
                      tokenizer=pair.tokenizer)
        by_batch[b] = records
    rows = batch_report.batch_rows(by_batch, heuristic, greedy)
    settings = _settings(args, pair, base, args.prompts, len(prompts), fmt) | {
        "batch_sizes": sizes, "heuristic": heuristic}
    print(batch_report.write(rows, out, settings, heuristic))
    print(f"wrote {out}/batches.md")
    return 0


def domain_baselines(args: argparse.Namespace, methods: list[str]) -> tuple[str | None, str | None]:
    """The deploy static and the heuristic of an evaluation across domains (see --help); the
    deploy static joins `methods` when it is not there."""
    from mcsd_runtime.evaluate.domain_report import deploy_static_of

    deploy = args.deploy
    if deploy is None:
        recorded = [deploy_static_of(m.split(":", 1)[1]) for m in methods
                    if m.startswith("stopper:")]
        deploy = next((d for d in recorded if d), None)
    if deploy is not None and deploy not in methods:
        methods.append(deploy)
    heuristic = args.heuristic or next((m for m in methods if m.startswith("heuristic")), None)
    if heuristic is not None and heuristic not in methods:
        raise MCSDError(f"--heuristic {heuristic!r} is not among --methods; add it there")
    return deploy, heuristic


def run_domains(args: argparse.Namespace, methods: list[str], base,
                domains: dict[str, tuple[str, list]]) -> int:
    """One interleaved run per domain (a prompt set, or a category of one), each written to its
    own subfolder, then the table across domains (domains.md, domains.json)."""
    from mcsd_runtime.evaluate import domain_report
    from mcsd_runtime.evaluate.eval_report import write_outputs
    from mcsd_runtime.evaluate.loop import run_eval
    from mcsd_runtime.evaluate.stats import summarize
    from mcsd_runtime.evaluate.training_results import stopper_results

    deploy, heuristic = domain_baselines(args, methods)
    out = output_folder(args)
    pair = _pair(args, methods)
    formats = check_formats(args, methods, pair, {n: p for n, (_, p) in domains.items()})
    stoppers = stopper_results(methods)
    by_domain = {}
    for name, (spec, prompts) in domains.items():
        print(f"{name}: {len(prompts)} prompts x {len(methods)} methods")
        records = run_eval(pair, prompts, methods, base, chat=args.chat,
                           batch_size=args.batch_size, samples=args.samples)
        rows = summarize(records, greedy=base.temperature == 0, reference=args.reference)
        cats = {p.category for p in prompts}
        settings = _settings(args, pair, base, spec, len(prompts), formats[name]) | {
            "category": cats.pop() if len(cats) == 1 else None}
        write_outputs(records, rows, out / name, settings, tokenizer=pair.tokenizer,
                      stoppers=stoppers)
        by_domain[name] = records
    rows = domain_report.domain_rows(by_domain, deploy, heuristic, base.temperature == 0)
    worst = domain_report.worst_domains(rows)
    settings = _settings(args, pair, base, args.prompts,
                         sum(len(p) for _, p in domains.values()))
    settings |= {"deploy": deploy, "deploy_given": args.deploy is not None,
                 "heuristic": heuristic, "domains": {n: spec for n, (spec, _) in domains.items()}}
    print(domain_report.write(rows, worst, out, settings))
    print(f"wrote {out}/domains.md")
    return 0


def _settings(args: argparse.Namespace, pair, base, prompts: str, n_prompts: int,
              prompt_format: dict | None = None) -> dict:
    import torch

    return {"target": pair.target_name, "draft": pair.draft_name, "prompts": prompts,
            "n_prompts": n_prompts, "chat": getattr(args, "chat", "auto"),
            "prompt_format": prompt_format, "temperature": base.temperature,
            "k_config": str(base.k_config), "verify": base.verify,
            "max_new_tokens": base.max_new_tokens, "seed": base.seed,
            "ignore_eos": base.eos_token_ids == (), "device": str(pair.device),
            "dtype": str(pair.dtype).removeprefix("torch."), "threads": torch.get_num_threads(),
            "batch_size": args.batch_size, "samples": getattr(args, "samples", 1)}


def combine_runs(args: argparse.Namespace, methods: list[str]) -> int:
    """The table across domains from finished eval folders (`--runs`), named by folder."""
    from mcsd_runtime.evaluate import domain_report
    if args.out is None:
        raise MCSDError("--runs needs --out, the folder for domains.md and domains.json")
    by_domain = {Path(d).name: domain_report.read_records(d) for d in args.runs}
    ran = {r.method for records in by_domain.values() for r in records}
    deploy, heuristic = domain_baselines(args, [m for m in methods if m in ran])
    settings = {"from_runs": [str(d) for d in args.runs], "deploy": deploy,
                "deploy_given": args.deploy is not None, "heuristic": heuristic}
    greedy = all(domain_report.run_settings(d).get("temperature", 0) == 0 for d in args.runs)
    rows = domain_report.domain_rows(by_domain, deploy, heuristic, greedy)
    print(domain_report.write(rows, domain_report.worst_domains(rows), args.out, settings))
    print(f"wrote {args.out}/domains.md")
    return 0
