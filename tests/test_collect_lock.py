"""Two processes taking over one stale run lock: only one may win, however their steps
interleave. Process B is simulated inside this one (its own pid, a live process's), at the
moment between process A's check that the dead job's lock is still there and A's takeover."""

from __future__ import annotations

import json
import os
import pathlib
import socket
import subprocess

import pytest

from collect import store
from collect.store import LOCK, run_lock
from mcsd_runtime.errors import MCSDError


def _write_lock(path: pathlib.Path, pid: int) -> None:
    path.write_text(json.dumps({"pid": pid, "host": socket.gethostname(), "started": "earlier"}))


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_two_processes_taking_over_one_stale_lock(tmp_path, monkeypatch):
    folder = tmp_path / "run"
    folder.mkdir()
    lock = folder / LOCK
    _write_lock(lock, dead_pid())  # a killed job's lock
    b = subprocess.Popen(["sleep", "60"])  # process B: alive while it holds the lock
    try:
        b_took: list[int] = []
        fired = []

        def process_b_takes_over() -> None:
            """B's whole takeover, as process B (another pid) would run it."""
            fired.append(True)
            with monkeypatch.context() as m:
                m.setattr(store, "_me", lambda: {"pid": b.pid, "host": socket.gethostname()})
                store._acquire(lock)
            b_took.append(json.loads(lock.read_text())["pid"])

        def hook(original):
            def hooked(target, *args, **kw):
                if not fired and os.fspath(target) == os.fspath(lock):
                    process_b_takes_over()  # B runs first, just before A's first change
                return original(target, *args, **kw)
            return hooked

        monkeypatch.setattr(os, "unlink", hook(os.unlink))
        monkeypatch.setattr(os, "rename", hook(os.rename))
        with pytest.raises(MCSDError, match=f"in use by another collect job \\(pid {b.pid}"), \
                run_lock(folder):
            pass  # A holds it too: two jobs would write the same folder
        assert b_took == [b.pid] and json.loads(lock.read_text())["pid"] == b.pid
    finally:
        b.kill()
        b.wait()
    assert [p.name for p in folder.iterdir()] == [LOCK]  # no leftover takeover files
