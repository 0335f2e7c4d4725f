"""The GPU check's preflight (`python -m mcsd_runtime.gpu_check.preflight --out F.json`), run
before any stage of each call: imports every package the stages use, the carried ones
included, and writes each one's version or import error, the device, and the commit the
staging recorded (no git needed). A stage that needs a package that did not import is
skipped by the runner; the others run."""

from __future__ import annotations

import argparse
import importlib
import json
import platform
import sys
import time
from pathlib import Path

# the packages the stages import: the image's, then those carried as wheels (staging)
PACKAGES = ("torch", "transformers", "safetensors", "numpy", "lightning", "pandas", "pyarrow",
            "sklearn", "scipy", "lightgbm", "gguf", "datasets")


def probe(names: tuple[str, ...] = PACKAGES) -> dict:
    """{name: {"version": ..., "s": import seconds} or {"error": ...}} for each package."""
    out = {}
    for name in names:
        t0 = time.perf_counter()
        try:
            mod = importlib.import_module(name)
            out[name] = {"version": str(getattr(mod, "__version__", "?")),
                         "s": round(time.perf_counter() - t0, 2)}
        except Exception as err:  # noqa: BLE001 - any import failure is reported
            out[name] = {"error": f"{type(err).__name__}: {err}"[:300]}
    return out


def device() -> dict:
    try:
        import torch
    except ImportError as err:
        return {"error": str(err)}
    if not torch.cuda.is_available():
        return {"cuda": False}
    props = torch.cuda.get_device_properties(0)
    return {"cuda": True, "name": props.name, "memory_gib": round(props.total_memory / 2**30, 1),
            "torch_cuda": torch.version.cuda}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m mcsd_runtime.gpu_check.preflight",
                                description=__doc__)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    from mcsd_runtime.gpu_check.staging import read_commit

    packages = probe()
    result = {"python": platform.python_version(), "machine": platform.machine(),
              "packages": packages, "device": device(), "commit": read_commit(),
              "unimportable": sorted(n for n, v in packages.items() if "error" in v)}
    for name, info in packages.items():
        print(f"{name}: {info.get('version') or 'NOT IMPORTABLE: ' + info['error']}")
    print(f"device: {json.dumps(result['device'])}; commit {result['commit']}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0 if "torch" not in result["unimportable"] else 1


if __name__ == "__main__":
    sys.exit(main())
