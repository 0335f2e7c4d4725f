"""One worker process of distillation data: `python -m mcsd_runtime.distill.worker_process
PLAN [PARENT_PID]` (started by `worker.run_workers`). It loads the target once, on one torch
thread, and takes the plan's jobs in order, claiming each with a file created exclusively
(`.claim-<run>-<stream>-<batch>`), so that the workers share the jobs dynamically (a worker on a
busy core takes fewer) and no job runs twice.

It ends with its parent: given PARENT_PID, it watches (`watch_parent`) whether that process is
still its parent, and exits once it is not (a parent killed outright, SIGKILL included, leaves
its children to another process). A parent that is asked to stop (SIGTERM) stops its workers
itself (`worker.run_workers`)."""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

PARENT_POLL_SECONDS = 0.5
PARENT_GONE_EXIT = 3  # the exit status of a worker whose parent went away


def watch_parent(parent: int, every: float = PARENT_POLL_SECONDS) -> threading.Thread:
    """Exit this process as soon as `parent` is no longer its parent: from a daemon thread,
    with `os._exit`, since the main thread may be deep inside a torch kernel."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(every)
        print(f"the parent process {parent} is gone: this worker stops", flush=True)
        os._exit(PARENT_GONE_EXIT)

    thread = threading.Thread(target=watch, name="watch-parent", daemon=True)
    thread.start()
    return thread


def _claim(folder: Path, run: str, job) -> bool:
    try:
        os.close(os.open(folder / f".claim-{run}-{job.stream}-{job.batch}",
                         os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        return True
    except FileExistsError:
        return False


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) > 1:  # watched before torch is imported: that alone takes seconds
        watch_parent(int(args[1]))
    import torch

    from mcsd_runtime.distill.data import DataStore, run_job
    from mcsd_runtime.distill.target import load_target

    plan = torch.load(args[0], weights_only=False)  # written by run_workers
    torch.set_num_threads(1)
    model, tokenizer = load_target(Path(plan["target"]))
    store = DataStore(Path(plan["store"]))
    for job in plan["jobs"]:
        if not store.has(job.stream, job.batch) and _claim(store.folder, plan["run"], job):
            run_job(job, model, tokenizer, plan["recipe"], store)
    return 0


if __name__ == "__main__":
    sys.exit(main())
