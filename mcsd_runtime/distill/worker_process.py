"""One worker process of distillation data: `python -m mcsd_runtime.distill.worker_process
PLAN` (started by `worker.run_workers`). It loads the target once, on one torch thread, and takes
the plan's jobs in order, claiming each with a file created exclusively
(`.claim-<run>-<stream>-<batch>`), so that the workers share the jobs dynamically (a worker on a
busy core takes fewer) and no job runs twice."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

from mcsd_runtime.distill.data import DataStore, run_job
from mcsd_runtime.distill.target import load_target


def _claim(folder: Path, run: str, job) -> bool:
    try:
        os.close(os.open(folder / f".claim-{run}-{job.stream}-{job.batch}",
                         os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        return True
    except FileExistsError:
        return False


def main(argv: list[str] | None = None) -> int:
    plan = torch.load((argv or sys.argv[1:])[0], weights_only=False)  # written by run_workers
    torch.set_num_threads(1)
    model, tokenizer = load_target(Path(plan["target"]))
    store = DataStore(Path(plan["store"]))
    for job in plan["jobs"]:
        if not store.has(job.stream, job.batch) and _claim(store.folder, plan["run"], job):
            run_job(job, model, tokenizer, plan["recipe"], store)
    return 0


if __name__ == "__main__":
    sys.exit(main())
