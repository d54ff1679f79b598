"""What the handlers, the reconcile passes and the poller share: settings, the API
client, the sidecars' reader, and what the watches have shown. kopf's memo carries it
(`memo.state`), so a test builds its own and calls a pass directly."""

from __future__ import annotations

import contextvars
import threading
from dataclasses import dataclass, field

from .config import OperatorSettings
from .fleet import Fleet
from .kube import Kube
from .pod_limits import PodLimits, TjKey
from .sidecar_status import StatusReader


@dataclass
class OperatorState:
    settings: OperatorSettings
    kube: Kube
    reader: StatusReader
    # (namespace, name) -> (phase, jobName) of every ThrottledJob the watch has shown.
    seen: dict[TjKey, tuple[str | None, str | None]] = field(default_factory=dict)
    # (namespace, ThrottledJob name) -> uid of its Job, as the Job watch showed it: only
    # pods that Job owns are ever read.
    job_uids: dict[TjKey, str] = field(default_factory=dict)
    # ThrottledJobs whose child is a JobSet, not a Job (child.py).
    jobsets: set[TjKey] = field(default_factory=set)
    # ThrottledJobs in attach mode (attach.py): their child is not theirs to own.
    attached: set[TjKey] = field(default_factory=set)
    # Of those, the ones attached by label: no one workload, its pods by our label alone.
    labeled: set[TjKey] = field(default_factory=set)
    # ThrottleBudgets the watch has shown, and what their passes share (fleet.py).
    budgets: set[TjKey] = field(default_factory=set)
    fleet: Fleet = field(default_factory=Fleet)
    stop: threading.Event = field(default_factory=threading.Event)
    # The one writer of the pods' CPU limits (pod_limits.py), with what it was refused.
    limits: PodLimits = field(init=False)
    # kopf.event/warn find kopf's event queue in context variables, set for handlers (not
    # yet for startup activities): the pool's threads run in a copy of a handler's.
    context: contextvars.Context | None = None

    def __post_init__(self) -> None:
        self.limits = PodLimits(self.kube)

    def is_jobset(self, namespace: str, name: str) -> bool:
        return (namespace, name) in self.jobsets
