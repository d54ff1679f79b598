"""`throttledjob ...` that also writes the lever explorer's report (bench use only).

    python bench/tjrun.py EXPLORER.json run [options] -- CMD

The run report of `throttledjob run` does not carry the explorer's estimates yet; this
wrapper writes `Agent.explorer_report()` to EXPLORER.json when the run ends.
"""

from __future__ import annotations

import json
import sys

from throttledjob.cli import main
from throttledjob.sidecar.agent import Agent


def _dump_on_close(path: str) -> None:
    close = Agent.close

    def patched(self: Agent) -> None:
        ex = self.explorer
        report = self.explorer_report()
        if report is not None and ex is not None:
            report["history"] = [f"{state}({levers})" for state, levers in ex.history]
        with open(path, "w") as f:
            json.dump({"explorer": report, "cpu_samples": [round(c, 2) for c in self.recent_cpu]},
                      f)
        close(self)

    Agent.close = patched  # type: ignore[method-assign]


if __name__ == "__main__":
    _dump_on_close(sys.argv[1])
    sys.exit(main(sys.argv[2:]))
