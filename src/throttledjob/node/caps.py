"""The power caps the node agent set, and the limit each GPU had before: kept in a state
file on the node, so that a restarted agent still puts them back.

A board's power limit outlives the process that set it (until reset or reboot), so
whoever caps a GPU must put it back: when the pod that asked leaves (`restore_pod`,
`restore_gone`), when the agent is told to stop (`stop`), and at the agent's start, for
caps whose pods ended while it was down. A cap is never over the limit the GPU had before
the first cap (a caller cannot raise a limit), and is clamped to the board's range.

The limits are the board's management limit (what a write sets), not the enforced one,
which out-of-band limiters (the BMC's) may hold lower for a while. A record keeps what the
agent set, and a GPU is put back only while its board still has that: a reset, a driver
reload or someone else's write since then made the limit not ours to undo (one line in
the log, the record dropped). A state file from another boot is dropped whole (a reboot
resets every board). The state is written before the board is touched, with the limit a
new cap replaces: an agent killed in between finds the original, and whichever of the two
the board has counts as ours. A write the board refuses leaves no record.
A restore touches the board first and the file last: a state file that cannot be written
then (a full disk, no file descriptor left) never keeps a GPU capped. The board has its
own limit back, the record is gone from memory, and the file is written again at the next
pass (`flush`); an agent killed before that finds a record whose board no longer has what
it set, which is not its to undo (dropped, as after a reset).
The pods' connections, the CSI calls and the tidying pass all call in: one lock makes each
cap or restore whole (a restore between a cap's record and its write to the board would
leave the board capped with no record, and the next cap would take it as the original).
Each GPU is looked up on its own: a board lost stops no other's restore.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from throttledjob.gpu.backend import GpuBackend, GpuError, GpuReading
from throttledjob.gpu.power_limit import SAME_WATTS, capped_limit
from throttledjob.runtime.files import read_json_bounded, write_json_atomic

from .identity import PodRef

log = logging.getLogger("throttledjob.node")
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
# A pod changes each GPU's cap at most CHANGES_PER_SECOND times a second, in bursts of
# CHANGE_BURST: each change takes the keeper's lock and writes the state file twice, and
# a pod asking in a loop must not hold up the others' restores. The sidecar changes a cap
# at most once a control interval; a request for the limit in force is not a change.
CHANGES_PER_SECOND = 5.0
CHANGE_BURST = 5.0
# The state files have no ceiling of their own (a node of time-sliced GPUs serves
# hundreds of pods, about 380 bytes each in volumes.json): past this, a file is not the
# agent's, set aside with a line in the log.
STATE_MAX_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True)
class Cap:
    original_watts: float   # the GPU's management limit before the first cap
    pod: str                # the pod that asked, "namespace/name"
    # The limit the agent set (None: a record of an earlier agent, which kept none).
    set_watts: float | None = None
    # While a new cap is being written: the one it replaces (the board has either).
    was_watts: float | None = None
    # The pod's UID ("": a record of an earlier agent): a pod of the same name made after
    # a force delete is another pod.
    pod_uid: str = ""

    def of(self, pods: Iterable[PodRef]) -> bool:
        """The record is one of these pods' (by UID; by name for an earlier agent's)."""
        return any(p.uid == self.pod_uid if self.pod_uid else p.key == self.pod
                   for p in pods)

    def ours(self, watts: float) -> bool:
        """The board's limit is one the agent set: the original is still to be put back."""
        if self.set_watts is None:   # an earlier agent's record: ours while under it
            return watts < self.original_watts - SAME_WATTS
        return any(w is not None and abs(watts - w) <= SAME_WATTS
                   for w in (self.set_watts, self.was_watts))


def boot_id(path: Path = BOOT_ID) -> str:
    """This boot's id ("" where it cannot be read: every record is then taken as this
    boot's, and is still put back only where the board has what the agent set)."""
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def _watts(value: Any) -> float | None:
    return None if value is None else float(value)


class CapKeeper:
    def __init__(self, backend: GpuBackend, state_path: Path, boot: str | None = None,
                 max_bytes: int = STATE_MAX_BYTES) -> None:
        """`boot`: this boot's id (default: the kernel's); `max_bytes`: a state file
        larger than this is not the agent's (set aside, said in the log)."""
        self.backend = backend
        self.path = state_path
        self.max_bytes = max_bytes
        self.boot = boot_id() if boot is None else boot
        self.stopping = False   # no cap is set once the agent began to stop
        self.caps: dict[str, Cap] = self._load()   # GPU UUID -> its cap
        self._lock = threading.RLock()
        self._unsaved = False   # a restore's file write failed: written again by flush()
        # (pod UID, GPU UUID) -> (changes left, when counted): a token bucket.
        self._changed: dict[tuple[str, str], tuple[float, float]] = {}

    def set_limit(self, gpu: GpuReading, pod: PodRef, watts: float,
                  served: Callable[[], bool] = lambda: True) -> float:
        """Cap `gpu` for `pod` at `watts`, within its range and never over the limit it
        had; at or over that limit, put it back. Returns the limit in force. `served`:
        whether the pod is still served, asked under the lock (a request in flight when
        its volume went, or when the agent began to stop, must not cap a GPU after the
        restore that followed)."""
        with self._lock:
            if self.stopping:
                raise GpuError("the node agent is stopping: no cap is set")
            if not served():
                raise GpuError(f"pod {pod.key} is not served any more: no cap is set")
            # The limit now, not as read before the lock.
            now = self.backend.power_management_limit_watts(gpu.index)
            span = self.backend.power_limit_range_watts(gpu.index)
            if now is None or span is None:
                raise GpuError(f"GPU {gpu.uuid} has no settable power limit")
            cap = self._still_ours(gpu.uuid, now)
            original = cap.original_watts if cap else now
            wanted = capped_limit(watts, original, span)
            if wanted >= original:
                self.restore(gpu.uuid)
                return original
            if cap is not None and cap.was_watts is None and cap.set_watts is not None \
                    and abs(cap.set_watts - wanted) <= SAME_WATTS \
                    and abs(now - wanted) <= SAME_WATTS:
                return wanted   # in force already: nothing written
            self._take_change(pod, gpu.uuid)
            self._write(gpu, cap or Cap(original, pod.key, pod_uid=pod.uid), wanted)
            return wanted

    def original_watts(self, gpu: GpuReading) -> float | None:
        """The limit `gpu` gets back: its record's original while capped, else its own
        limit now (None: no settable limit)."""
        with self._lock:
            now = self.backend.power_management_limit_watts(gpu.index)
            cap = self.caps.get(gpu.uuid)
            if now is None or cap is None or not cap.ours(now):
                return now
            return cap.original_watts

    def restore(self, uuid: str) -> None:
        """Put one GPU back to its own limit, where its board still has what the agent
        set (nothing to do if it is not capped). The board first, the file last: a file
        that cannot be written leaves no GPU capped (see the module's note)."""
        with self._lock:
            cap = self.caps.get(uuid)
            if cap is None:
                return
            try:
                index = self.backend.index_of(uuid)
                now = None if index is None else self.backend.power_management_limit_watts(index)
            except GpuError as e:
                if not e.lost:   # kept: tried again at the next pass
                    raise
                index = now = None   # off the bus: a reset gives it its own limit back
            if index is None:
                log.warning("throttledjob node: GPU %s is gone; its cap is forgotten", uuid)
            elif now is None or not cap.ours(now):
                _say_not_ours(uuid, cap, now)
            else:
                self.backend.set_power_limit_watts(index, cap.original_watts)
                log.info("throttledjob node: GPU %s back to %.0f W", uuid, cap.original_watts)
            del self.caps[uuid]
            self._unsaved = True
            self.flush()

    def flush(self) -> None:
        """Write the state file where a restore could not (never raises: the boards hold
        their own limits already, and the next pass tries again)."""
        with self._lock:
            if not self._unsaved:
                return
            try:
                self._save()
            except OSError as e:
                log.error("throttledjob node: cannot write %s (%s): the GPUs are put back, "
                          "the file is written again at the next pass", self.path, e)
                return
            self._unsaved = False

    def restore_pod(self, uid: str) -> None:
        """Put back every cap the pod of `uid` asked for (its volume went: it is ending;
        its rate's count goes at the next `restore_unserved`)."""
        self._restore_where(lambda uuid, cap: cap.pod_uid == uid)

    def restore_unserved(self, served: Iterable[PodRef]) -> None:
        """Put back every cap whose pod is not served (its volume is gone, or was never
        published again after a restart): the agent's own state alone, no kubelet."""
        served = list(served)
        with self._lock:
            uids = {p.uid for p in served}
            self._changed = {k: t for k, t in self._changed.items() if k[0] in uids}
        self._restore_where(lambda uuid, cap: not cap.of(served))

    def restore_gone(self, live: Mapping[str, frozenset[str]],
                     shared: frozenset[str] = frozenset()) -> None:
        """Put back every cap whose pod no longer holds its GPU (`live`: the GPUs the
        kubelet lists for each pod; a pod of the same name may hold another GPU now), and
        every cap of a GPU now `shared` by several pods (a GPU shared is capped by none)."""
        self._restore_where(
            lambda uuid, cap: uuid not in live.get(cap.pod, frozenset()) or uuid in shared)

    def restore_all(self) -> None:
        self._restore_where(lambda uuid, cap: True)

    def stop(self) -> None:
        """Refuse every cap from now on, then put every one back: under one hold of the
        lock, so a cap that took the lock first is put back with the rest."""
        with self._lock:
            self.stopping = True
            self.restore_all()

    def _take_change(self, pod: PodRef, uuid: str) -> None:
        now = time.monotonic()
        left, at = self._changed.get((pod.uid, uuid), (CHANGE_BURST, now))
        left = min(CHANGE_BURST, left + (now - at) * CHANGES_PER_SECOND)
        if left < 1:
            raise GpuError(f"pod {pod.key} changes the cap of GPU {uuid} more than "
                           f"{CHANGES_PER_SECOND:.0f} times a second: refused")
        self._changed[(pod.uid, uuid)] = (left - 1, now)

    def _still_ours(self, uuid: str, now: float) -> Cap | None:
        """`uuid`'s record, where its board still has what the agent set; a record it no
        longer has is dropped (the board's limit now is the original from here on)."""
        cap = self.caps.get(uuid)
        if cap is None or cap.ours(now):
            return cap
        _say_not_ours(uuid, cap, now)
        del self.caps[uuid]
        self._save()
        return None

    def _write(self, gpu: GpuReading, cap: Cap, watts: float) -> None:
        before = self.caps.get(gpu.uuid)
        self.caps[gpu.uuid] = replace(cap, set_watts=watts,
                                      was_watts=before.set_watts if before else None)
        self._save()
        try:
            self.backend.set_power_limit_watts(gpu.index, watts)
        except GpuError:
            # Refused (no permission, not supported): no cap of ours is in force, so no
            # record says one is (a phantom would be "put back" at every pass).
            if before is None:
                del self.caps[gpu.uuid]
            else:
                self.caps[gpu.uuid] = before
            self._save()
            raise
        if before is not None:
            self.caps[gpu.uuid] = replace(self.caps[gpu.uuid], was_watts=None)
            self._save()

    def _restore_where(self, which: Callable[[str, Cap], bool]) -> None:
        with self._lock:
            for uuid, cap in list(self.caps.items()):
                if which(uuid, cap):
                    try:
                        self.restore(uuid)
                    except (GpuError, OSError) as e:   # kept: tried again at the next pass
                        log.warning("throttledjob node: could not restore GPU %s: %s", uuid, e)

    def _load(self) -> dict[str, Cap]:
        """The caps on record; a file that cannot be read (a crash before it reached the
        disk) is set aside with one line in the log, not a crash at every start. A file
        of another boot is dropped: the boards have their own limits back."""
        if not self.path.exists():
            return {}
        try:
            doc = read_json_bounded(str(self.path), self.max_bytes)
            caps = {uuid: Cap(float(c["original_watts"]), str(c["pod"]),
                              _watts(c.get("set_watts")), _watts(c.get("was_watts")),
                              str(c.get("pod_uid") or ""))
                    for uuid, c in (doc.get("caps") or {}).items()}
            boot = doc.get("boot_id")
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            aside = self.path.with_suffix(".bad")
            self.path.replace(aside)
            log.error("throttledjob node: %s unreadable (%s), moved to %s: its caps are not "
                      "put back by the agent", self.path, e, aside)
            return {}
        if caps and boot and self.boot and boot != self.boot:
            log.warning("throttledjob node: %s is of another boot: its %d caps are dropped "
                        "(a reboot gave every GPU its own limit back)", self.path, len(caps))
            return {}
        return caps

    def _save(self) -> None:
        write_json_atomic(str(self.path), {
            "boot_id": self.boot,
            "caps": {uuid: asdict(c) for uuid, c in self.caps.items()}})


def _say_not_ours(uuid: str, cap: Cap, now: float | None) -> None:
    log.warning("throttledjob node: GPU %s has a limit of %s, not the %s the agent set "
                "(reset, or set by someone else): left as it is, its record dropped", uuid,
                "unknown" if now is None else f"{now:.0f} W",
                "limit" if cap.set_watts is None else f"{cap.set_watts:.0f} W")
