"""Starting the processes that generate distillation data (`python -m
mcsd_runtime.distill.worker_process PLAN`, see there) and watching the store for their batches:
a job's batch lands in the store as it finishes, which is the parent's progress."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

import torch

from mcsd_runtime.errors import MCSDError

POLL_SECONDS = 1.0


def run_workers(jobs: list, recipe, store, target_folder: Path, workers: int, bar=None) -> None:
    """Run `jobs` (data.Job) in `workers` processes until the store has them all."""
    run = secrets.token_hex(4)
    plan = store.folder / f".plan-{run}.pt"
    torch.save({"jobs": jobs, "recipe": recipe, "store": str(store.folder),
                "target": str(target_folder), "run": run}, plan)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    logs = [store.folder / f".worker-{run}-{i}.log" for i in range(workers)]
    procs = []
    try:
        for log in logs:
            with log.open("w") as out:
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", "mcsd_runtime.distill.worker_process", str(plan)],
                    stdout=out, stderr=subprocess.STDOUT, env=env))
        done: set = set()
        while True:
            finished = [p.poll() is not None for p in procs]
            for job in jobs:
                key = (job.stream, job.batch)
                if key not in done and store.has(*key):
                    done.add(key)
                    if bar is not None:
                        bar.update(len(store.load(*key) or []))
            if all(finished):
                break
            time.sleep(POLL_SECONDS)
        failed = [(i, p.returncode) for i, p in enumerate(procs) if p.returncode]
        missing = [j for j in jobs if not store.has(j.stream, j.batch)]
        if failed or missing:
            tail = logs[failed[0][0]].read_text()[-2000:] if failed else ""
            raise MCSDError(f"a data worker failed (exit codes {[c for _, c in failed]}, "
                            f"{len(missing)} batches missing); its log ends:\n{tail}")
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            p.wait()
        for path in [plan, *logs, *store.folder.glob(f".claim-{run}-*")]:
            path.unlink(missing_ok=True)
