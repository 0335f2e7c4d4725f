"""The defaults of `mcsd collect` that other modules share (a module of their own, so that the
package's submodules need not import the package)."""

DEFAULT_PROMPTS = "toy-code-collect"  # the prompt set `mcsd collect` and its bench default to
DEFAULT_SHARD_PROMPTS = 8  # prompts per Parquet shard (`--shard-prompts`, `CollectJob`)
