"""The GPU check: `python scripts/gpu_check.py run|plan|stage|join` (docs/gpu-check.md;
`mcsd_runtime.gpu_check` says what each does)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mcsd_runtime.gpu_check import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main())
