"""Where things are: the repository, the venv's commands, the standard workload. Stdlib
only, so the benchmarks and `make demo` (no test tools installed) import it too."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# The interpreter's own bin: the venv that runs the suite holds `throttledjob`, `helm`.
VENV_BIN = Path(sys.executable).parent
# Two busy processes (or one, with --workers 1): the standard CPU-hungry workload.
HUNGRY = [sys.executable, str(ROOT / "examples" / "cpu_hungry.py")]
CHART = ROOT / "charts" / "throttledjob"
