"""`mcsd profile`: measure a cost profile on this machine (`benchmarks.measure`) and write it
(`pricing.profile`); the command's description is those two modules' documentation.
"""

from __future__ import annotations

import argparse

from mcsd_runtime.benchmarks import measure as cost_measure
from mcsd_runtime.errors import MCSDError
from mcsd_runtime.pricing import profile as cost_profile


def register(sub: argparse._SubParsersAction) -> None:
    from mcsd_runtime.cli.args import add_out_arg, add_pair_args, add_threads_arg

    p = sub.add_parser(
        "profile", help="measure forward latency against tokens processed (cost profile JSON)",
        description=f"{cost_profile.__doc__}\n{cost_measure.__doc__}",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    add_pair_args(p)
    add_out_arg(p, "profile JSON to write", required=True)
    _add_forward_args(p)
    _add_decoder_run_args(p)
    add_threads_arg(p)
    _add_engine_args(p)
    p.set_defaults(func=run)


def _add_engine_args(p: argparse.ArgumentParser) -> None:
    """`--engine vllm`: an engine profile (mcsd_runtime.serving.vllm_profile) instead."""
    from mcsd_runtime.cli.args import add_engine_arg

    g = p.add_argument_group(
        "a serving engine's profile", "With --engine vllm, one vLLM engine times a step with C "
        "requests in flight (C from --batch-size) each drafting exactly K tokens (K from "
        "--draft-lengths), on the first C prompts of --prompts in --dtype, decoding "
        "--max-new-tokens and a third of them (prefills cancel out): --max-new-tokens, not "
        "--limit, lengthens a point. The JSON is the engine profile that `mcsd train --decision "
        "schedule` and `--decision copy` read as --cost-profile.")
    add_engine_arg(g, "mcsd: the decoder's cost profile (default); vllm: vLLM's engine profile")
    g.add_argument("--draft-lengths", default="0,1,2,3,4", metavar="K[,K...]",
                   help="--engine vllm: the draft lengths timed (0: no draft; default "
                        "%(default)s)")


def _add_forward_args(p: argparse.ArgumentParser) -> None:
    """The group of the timed forwards: token counts, rounds, context and batch sizes."""
    from mcsd_runtime.cli.args import add_batch_size_arg, add_timing_args

    g = p.add_argument_group("the timed forwards")
    g.add_argument("--max-tokens", type=int, default=64,
                   help="largest number of new tokens per forward (default %(default)s)")
    add_timing_args(g, rounds=7, context="256",
                    rounds_help="timed rounds over all token counts, each in a random order; "
                                "the median is kept (default %(default)s)",
                    context_help="KV cache length the forwards run over (default %(default)s)")
    add_batch_size_arg(g, "batch sizes whose forwards are timed (B rows of n tokens each; 1 is "
                          "always measured) and whose overheads are fitted to batched runs; "
                          "replay at B rows needs B within them (default %(default)s)",
                       several=True, default=",".join(map(str, cost_measure.DEFAULT_BATCH_SIZES)))


def _add_decoder_run_args(p: argparse.ArgumentParser) -> None:
    """The group of the decoder's runs: the static depths decoded end to end, whose forwards
    and overheads the profile fits."""
    from mcsd_runtime.cli.args import (
        DEFAULT_K_TEXT,
        add_graphs_arg,
        add_k_config_arg,
        add_limit_arg,
        add_max_new_tokens_arg,
        add_prompts_arg,
        add_temperature_arg,
    )
    from mcsd_runtime.prompts.chat import add_chat_arg

    g = p.add_argument_group(
        "the decoder's runs", "Static depths 1..D of --k-config decoded end to end: the forwards "
        "timed there replace the isolated ones, and the decoder's per-step and per-depth "
        "overheads are fitted to them.")
    add_k_config_arg(g, DEFAULT_K_TEXT, "the tree of the static runs and of the ragged rows' "
                                        "width; use the collection's tree (default %(default)s)")
    add_prompts_arg(g, "prompt set of those runs; 'none' skips them (default %(default)s)",
                    default="toy-code")
    add_limit_arg(g, "prompts of those runs (at batch size B > 1 at least 2B; default "
                     "%(default)s)", default=6)
    add_max_new_tokens_arg(g, 48, "new tokens per run (default %(default)s)")
    add_temperature_arg(g, "temperature of those runs: sampling costs a step more than an argmax "
                           "(a drafted step more than AR's), so profile at the temperature the "
                           "replays will price (default %(default)s: greedy)")
    g.add_argument("--widths", action="store_true",
                   help="also decode depth 1 at every narrower first depth (trees (w,), w < k) "
                        "at batch size 1, so that forwards of 2..k tokens are timed in the "
                        "decoder: profile so for `mcsd train --decision width`")
    add_graphs_arg(g)
    add_chat_arg(g)


def run(args: argparse.Namespace) -> int:
    from mcsd_runtime.cli.args import (
        apply_threads,
        pair_from_args,
        parse_batch_sizes,
        parse_counts,
    )
    from mcsd_runtime.extras import require_toolkit
    from mcsd_runtime.tree import Tree, parse_k_config

    if args.engine == "vllm":
        return _run_vllm(args)
    require_toolkit("mcsd profile", "scipy")  # the overhead fit
    (context, *more) = parse_counts(args.context, "--context")
    if more:
        raise MCSDError(f"--context: profile times forwards over one cache length, got "
                        f"{args.context!r}")
    if min(args.max_tokens, args.rounds, args.limit, args.max_new_tokens) < 1:
        raise MCSDError("--max-tokens, --rounds, --context, --limit and --max-new-tokens must be "
                        "positive")
    if not args.temperature >= 0:
        raise MCSDError(f"--temperature must be >= 0 (0: greedy), got {args.temperature}")
    k_config = parse_k_config(args.k_config)
    sizes = sorted({1, *parse_batch_sizes(args.batch_size, "--batch-size")})
    apply_threads(args)
    pair = pair_from_args(args)
    tokens = [n for n in cost_measure.DEFAULT_TOKENS if n <= args.max_tokens]
    if tokens[-1] != args.max_tokens:
        tokens.append(args.max_tokens)
    ragged = len(sizes) > 1 and cost_measure.runs_ragged(pair)
    # ragged rows no wider than the tree's widest target forward (its bonus and every node)
    width = min(tokens[-1], 1 + Tree(k_config).cum[-1]) if k_config else tokens[-1]
    print(f"timing forwards: {len(tokens)} token counts x 2 models x {len(sizes)} batch size(s) "
          f"x {args.rounds} rounds" + (f", and ragged forwards (rows at most {width} tokens) "
                                       f"at each batch size above 1" if ragged else ""),
          flush=True)
    if len(sizes) > 1 and not ragged:
        print("note: the models do not attend with mcsd_sdpa: ragged forwards are not timed, "
              "and are priced by the padded curves")
    profile = cost_measure.measure(pair, tokens, context=context, rounds=args.rounds,
                                   progress=True, batch_sizes=tuple(sizes), ragged_width=width)
    if args.prompts != "none" and k_config:
        profile = _calibrate(args, pair, profile, k_config, sizes)
    profile.save(args.out)
    _report(profile)
    print(f"-> {args.out}")
    return 0


def _report(profile: cost_profile.CostProfile) -> None:
    """One line per batch size: its curves' ends, overheads and ragged points."""
    n = profile.tokens[-1]
    for b in profile.batch_sizes:
        t, d = profile._curve("target_s", b), profile._curve("draft_s", b)
        step, depth = profile.overheads(b)
        print(f"B={b}: target {t[0] * 1e3:.2f} ms at 1 token per row, {t[-1] * 1e3:.2f} ms at "
              f"{n}; draft {d[0] * 1e3:.2f} ms / {d[-1] * 1e3:.2f} ms; overhead "
              f"{step * 1e3:.2f} ms/step + {depth * 1e3:.3f} ms/depth")
        if b in profile.ragged:
            for name, points in (("target", profile.ragged[b].target),
                                 ("draft", profile.ragged[b].draft)):
                print(f"  ragged {name} (tokens in all: ms): " + ", ".join(
                    f"{t:g}: {s * 1e3:.2f}" for t, s in points))


def _calibrate(args: argparse.Namespace, pair, profile: cost_profile.CostProfile,
               k_config: tuple[int, ...], sizes: list[int]) -> cost_profile.CostProfile:
    """`profile` calibrated on the decoder's static runs at every batch size of `sizes`."""
    from mcsd_runtime.evaluate.runners import encode_prompt
    from mcsd_runtime.prompts.chat import prompt_format
    from mcsd_runtime.prompts.sets import load_prompts

    for b in sizes:  # above batch size 1: enough prompts to fill the batch twice
        limit = args.limit if b == 1 else max(args.limit, 2 * b)
        prompts = load_prompts(args.prompts, limit=limit)
        ids = [encode_prompt(pair, p, args.chat) for p in prompts]
        widths = args.widths and b == 1
        print(f"calibrating on the decoder at batch size {b}: AR and static depths "
              f"1..{len(k_config)} of {k_config}"
              + (f", and depth 1 at widths 1..{k_config[0] - 1}" if widths else "")
              + f" on {len(ids)} prompts at temperature {args.temperature:g}", flush=True)
        runs, forwards = cost_measure.static_runs(pair, ids, k_config, args.max_new_tokens,
                                                  progress=True, batch_size=b,
                                                  temperature=args.temperature, widths=widths,
                                                  graphs=args.graphs)
        profile = cost_measure.calibrate(profile, runs, forwards, batch_size=b)
        if b > 1:
            profile.batches[b].static["prompts"] = len(ids)
    profile.static |= {"k_config": k_config.json(), "temperature": args.temperature,
                       "prompt_set": args.prompts,
                       "max_new_tokens": args.max_new_tokens,
                       "prompt_format": prompt_format(prompts, pair.tokenizer, args.chat)}
    return profile


def _run_vllm(args: argparse.Namespace) -> int:
    """`mcsd profile --engine vllm`: the engine profile of --target (see the group's help)."""
    from mcsd_runtime.cli.args import parse_batch_sizes, parse_counts
    from mcsd_runtime.cli.eval_vllm import vllm_dtype
    from mcsd_runtime.models.pair import target_folder
    from mcsd_runtime.prompts.chat import encode_prompt
    from mcsd_runtime.prompts.sets import load_prompts
    from mcsd_runtime.serving.vllm_engine import require_vllm
    from mcsd_runtime.serving.vllm_profile import measure

    require_vllm()
    ks = parse_counts(args.draft_lengths, "--draft-lengths", minimum=0)
    sizes = sorted(set(parse_batch_sizes(args.batch_size, "--batch-size")))
    if args.max_new_tokens < 6:
        raise MCSDError("--max-new-tokens: profile at least 6 new tokens (a third of them is "
                        "the short run)")
    model = target_folder(args.target, build=True)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    prompts = [encode_prompt(p, tokenizer, args.chat)
               for p in load_prompts(args.prompts, limit=max(args.limit, 1))]
    profile = measure(model, vllm_dtype(args.dtype), ks, sizes, prompts,
                      long=args.max_new_tokens)
    profile.save(args.out)
    print(f"-> {args.out}")
    return 0
