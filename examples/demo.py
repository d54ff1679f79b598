"""`make demo`: the bundled CPU-hungry workload, unthrottled and under a CPU peak target.

    make demo       # or, from the repository root: python -m examples.demo

Runs examples/cpu_hungry.py four times on this machine and prints a side-by-side
summary: as it is; held by the kernel's CPU quota (the default, what a pod's
`limits.cpu` gives, here with the explorer looking for cheaper levers); shaved by signals
(no code change, for machines where no quota can be set); and paced by the runtime
library (the workload calls tj.step()).
"""

from __future__ import annotations

from bench.harness import markdown, row, throttledjob_run
from testing.paths import HUNGRY

TARGET = "1.2"
WORK = ["--workers", "2", "--units", "250"]


def main() -> None:
    print(f"ThrottledJob demo: a 2-process CPU-hungry job, then the same job held to "
          f"{TARGET} cores.\n", flush=True)
    print("1/4 unthrottled ...", flush=True)
    base = throttledjob_run([], [*HUNGRY, *WORK])
    options = ["--cpu-peak", TARGET, "--max-slowdown", "2"]
    print(f"2/4 throttledjob run --cpu-peak {TARGET} (the kernel's quota) ...", flush=True)
    quota = throttledjob_run(options, [*HUNGRY, *WORK])
    print(f"3/4 throttledjob run --cpu-peak {TARGET} --enforcement signals ...", flush=True)
    signals = throttledjob_run([*options, "--enforcement", "signals"], [*HUNGRY, *WORK])
    print(f"4/4 throttledjob run --cpu-peak {TARGET} --enforcement both (workload calls "
          "tj.step()) ...", flush=True)
    paced = throttledjob_run([*options, "--enforcement", "both"],
                             [*HUNGRY, *WORK, "--cooperative"])
    enforcer = quota["controller"]["enforcer"].split(" (")[0]  # "kernel quota", or the fallback
    rows = [row("unthrottled", base, None), row(f"default: {enforcer}", quota, base),
            row("signals (no code change)", signals, base),
            row("cooperative pacing", paced, base)]
    print("\n" + markdown(rows))
    if base["cpu_peak_cores"] <= float(TARGET):
        print(f"\nThe job never reached {TARGET} cores on this machine (is it busy?): "
              "there was no peak to shave.")
        return
    cut = 1 - quota["cpu_peak_cores"] / base["cpu_peak_cores"]
    print(f"\nPeak (p99 of 1-second samples) cut by {cut:.0%}, from "
          f"{base['cpu_peak_cores']:.2f} to {quota['cpu_peak_cores']:.2f} cores (target "
          f"{TARGET}). A job that keeps every core busy cannot go faster than "
          f"{base['cpu_mean_cores'] / float(TARGET):.2f}x its time at that target. This job "
          "has no cheaper lever than the quota (it runs one thread per process and reports "
          "no batch size), so the quota's row is the one to beat, and signals and pacing "
          "can only match it.")


if __name__ == "__main__":
    main()
