"""Live policy reload from a file projected out of a ConfigMap.

kubelet updates a ConfigMap volume by swapping a `..data` symlink, so the file's
inode, mtime and even path may not change the way an editor's save would. Comparing
content is the one check that sees every update; the file is at most 64 KiB and is
read once per control interval.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from throttledjob.contracts.policy import MAX_POLICY_BYTES, Policy, PolicyError, load_policy_file


class PolicyWatcher:
    """`poll()` returns a new Policy when the file's content changed to a valid one, with
    `overrides` (the command line's, Policy.with_overrides) applied to each."""

    def __init__(self, path: str, initial: Policy | None = None,
                 overrides: Mapping[str, Any] | None = None) -> None:
        self.path = path
        self.overrides = dict(overrides or {})
        self.policy = initial
        self.error: str | None = None
        self.reloads = {"success": 0, "failure": 0}
        self._digest: bytes | None = None

    def poll(self) -> Policy | None:
        digest = self._read_digest()
        if digest == self._digest:
            return None
        self._digest = digest
        try:
            policy = load_policy_file(self.path).with_overrides(**self.overrides)
        except PolicyError as e:
            # Keep the last valid policy: a typo in an edit must not unthrottle the job.
            self.error = f"{e}; keeping the last valid policy"
            self.reloads["failure"] += 1
            return None
        self.error = None
        self.reloads["success"] += 1
        changed = policy != self.policy
        self.policy = policy
        return policy if changed else None

    def _read_digest(self) -> bytes:
        try:
            with open(self.path, "rb") as f:
                return hashlib.sha256(f.read(MAX_POLICY_BYTES + 1)).digest()
        except OSError as e:
            # Unreadable counts as content of its own, so it is reported once, not per poll.
            return hashlib.sha256(f"error:{e.errno}".encode()).digest()
