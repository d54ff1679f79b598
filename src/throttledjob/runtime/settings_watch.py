"""Reading the settings file from the workload: cheap, and never in the workload's way."""

from __future__ import annotations

import logging
import os
import time

from throttledjob.contracts.settings import SETTINGS_FILE, UNTHROTTLED, Settings, parse_settings

from .files import read_json_bounded

log = logging.getLogger("throttledjob.runtime")


class SettingsWatcher:
    """Cheap, fault-tolerant view of the settings file for code running in the workload.

    `current()` stats the file at most every `check_interval` seconds and re-reads it only
    when its mtime or size changed. A partial, corrupt or unknown-version file keeps the
    last good settings (logged once per distinct problem). When the file is missing or
    older than its `stale_after_seconds`, `on_stale` decides: "open" runs unthrottled
    (the default: a dead sidecar must not slow the job), "hold" keeps the last settings.
    """

    def __init__(self, directory: str, check_interval: float = 0.25, on_stale: str = "open",
                 clock=time.time, monotonic=time.monotonic) -> None:
        if on_stale not in ("open", "hold"):
            raise ValueError(f"on_stale must be 'open' or 'hold', got {on_stale!r}")
        self.path = os.path.join(directory, SETTINGS_FILE)
        self.check_interval = check_interval
        self.on_stale = on_stale
        self._clock = clock
        self._monotonic = monotonic
        self._next_check = 0.0
        self._stamp: tuple[float, int] | None = None
        self._changed_at = 0.0   # monotonic: when the file was last seen to change
        self._good = UNTHROTTLED
        self._current = UNTHROTTLED
        self._last_problem: str | None = None
        self.stale = True

    def current(self) -> Settings:
        now = self._monotonic()
        if now >= self._next_check:
            self._next_check = now + self.check_interval
            self._refresh()
        return self._current

    def _refresh(self) -> None:
        try:
            st = os.stat(self.path)
        except OSError:
            self._set_stale("settings file missing")
            return
        stamp = (st.st_mtime, st.st_size)
        if stamp != self._stamp:
            self._stamp, self._changed_at = stamp, self._monotonic()
            try:
                self._good = parse_settings(read_json_bounded(self.path))
                self._last_problem = None
            # Whatever the file holds must not reach the workload: besides OSError and
            # ValueError (SettingsError, bad JSON), deep nesting raises RecursionError.
            except Exception as e:
                self.report(f"keeping last good settings: {type(e).__name__}: {str(e)[:200]}")
        # By its age, and by how long it has not changed (the sidecar rewrites it every
        # interval): the wall clock stepped back made a dead sidecar's file look new.
        limit = self._good.stale_after_seconds
        if (self._clock() - st.st_mtime > limit
                or self._monotonic() - self._changed_at > limit):
            self._set_stale("settings file is stale (is the sidecar alive?)")
        else:
            self.stale = False
            self._current = self._good

    def _set_stale(self, why: str) -> None:
        if not self.stale:
            then = "running unthrottled" if self.on_stale == "open" else "holding last settings"
            self.report(f"{why}; {then}")
        self.stale = True
        self._current = UNTHROTTLED if self.on_stale == "open" else self._good

    def report(self, problem: str) -> None:
        if problem != self._last_problem:
            log.warning("throttledjob: %s", problem)
            self._last_problem = problem
