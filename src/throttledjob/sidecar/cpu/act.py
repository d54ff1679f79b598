"""Act: publish a decision to the workload: the settings file the runtime library paces
by, and the enforcer that holds processes that do not pace themselves.

Which of the two holds the workload in an interval follows the plan
(sidecar/cpu/enforcement.py): pacing where the plan paces, the enforcer where it holds
always, and in Both the enforcer only while the workload does not pace itself.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from throttledjob.contracts.policy import Enforcement, Policy
from throttledjob.contracts.settings import SETTINGS_FILE, Settings
from throttledjob.runtime.files import write_json_atomic

from .enforcement import Plan
from .enforcer import Enforcer
from .lever_settings import LeverSetting, Pacing

# With enforcement Both, the workload counts as cooperating while it has called step()
# within this many control intervals; otherwise the signal enforcer takes over.
COOPERATION_TIMEOUT_INTERVALS = 3


@dataclass(frozen=True)
class Acted:
    """What an actuation left in force."""

    paced: bool              # the runtime was given the rate
    enforcer_armed: bool     # the enforcer holds the workload to it
    error: str | None        # the settings file could not be written


def stop_pacing(plan: Plan, levers: LeverSetting) -> bool:
    """In Both, the explorer may find stopping cheaper than pacing at the steps."""
    return plan.enforcement is Enforcement.BOTH and levers.pacing == Pacing.STOP


class Actuator:
    def __init__(self, settings_dir: str) -> None:
        self.settings_dir = settings_dir
        self.seq = 0
        # Pacing was by stop in the last actuation: the enforcer stays armed one interval
        # more when pacing goes back to the runtime, which picks the rate up only at its
        # next settings check.
        self.stopping = False

    def act(self, rate: float | None, policy: Policy, plan: Plan, levers: LeverSetting,
            max_pause: float | None, enforcer: Enforcer | None, idle_seconds: float,
            now: float) -> Acted:
        """Publish `rate` (cores, None: none) under `levers`; `idle_seconds`: since the
        workload last reported a step. `max_pause` None: a probe, held at the rate off
        the budget's books (CpuBudget)."""
        stopping = stop_pacing(plan, levers)
        handing_over, self.stopping = self.stopping, stopping
        paced = plan.pacing and not stopping
        use_enforcer = plan.enforcer_always or (
            plan.enforcement is Enforcement.BOTH
            and (stopping or handing_over
                 or idle_seconds > COOPERATION_TIMEOUT_INTERVALS * policy.interval_seconds))
        self.seq += 1
        settings = Settings(
            seq=self.seq, time=time.time(),
            # Published even while the enforcer holds the tree: a process that starts
            # calling step() paces from its first call, with no unthrottled hand-over gap.
            cpu_quota_cores=rate if paced else None,
            max_pause_fraction=policy.max_pause_fraction if max_pause is None else max_pause,
            probing=max_pause is None,
            threads=levers.threads, batch_scale=levers.batch_scale,
            rate_limit_per_second=policy.rate_limit_per_second,
            gpu_memory_fraction=policy.gpu_memory_fraction, params=policy.params,
            stale_after_seconds=max(10.0, 5 * policy.interval_seconds),
        )
        error = None
        try:
            write_json_atomic(os.path.join(self.settings_dir, SETTINGS_FILE),
                              settings.to_dict())
        except OSError as e:
            error = f"cannot write settings: {e.strerror or e}"
        armed = False
        if enforcer:
            enforcer.set(rate if use_enforcer else None, max_pause)
            armed = bool(rate and use_enforcer)
        return Acted(paced, armed, error)
