"""Who is asking. Each pod reaches the node agent through a socket of its own, made in the
pod's CSI volume (node/csi.py): the kubelet tells the agent the pod's namespace, name and
UID when it asks for the volume, and mounts it into that pod alone. A second check, from
the connection itself, refuses a caller whose cgroup names another pod (a socket passed
on, or a path reached some other way).

The kernel says which process connected (SO_PEERCRED: its pid, as the agent sees it,
which is the host's pid where the agent runs with `hostPID`), and that process's cgroup
says which pod it runs in: the kubelet puts every container of a pod under a cgroup named
after the pod's UID. Nothing the caller sends is trusted for this.

- cgroupfs driver: `/kubepods/burstable/pod<uid>/<container>` (`/kubepods/pod<uid>/...`
  for a Guaranteed pod);
- systemd driver: `.../kubepods-burstable-pod<uid with _ for ->.slice/cri-...scope`.

A pid can exit and be reused between connect and the lookup; the lookup is made once,
at accept, while the caller is connected (a process blocked in connect or waiting for
its answer is alive).
"""

from __future__ import annotations

import re
import socket
import struct
from dataclasses import dataclass
from pathlib import Path

_POD = re.compile(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})")


@dataclass(frozen=True)
class PodRef:
    namespace: str
    name: str
    uid: str
    # The pod's ThrottledJob allowed the power cap when the pod was made: its volume's
    # attribute, which the operator sets (and only the operator's pods carry the volume).
    power_cap: bool = False

    @property
    def key(self) -> str:
        """How the kubelet's PodResources names it."""
        return f"{self.namespace}/{self.name}"


def pod_uid_of_cgroup(cgroup_file: str) -> str | None:
    """The pod UID in a /proc/<pid>/cgroup file's text (None: not a pod's process)."""
    for line in cgroup_file.splitlines():
        found = _POD.search(line.rpartition(":")[2])
        if found:
            return found.group(1).replace("_", "-")
    return None


def peer_pid(conn: socket.socket) -> int:
    """The pid of the process that connected (SO_PEERCRED)."""
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[0]


def peer_pod_uid(conn: socket.socket, proc: Path = Path("/proc")) -> str | None:
    """The pod the caller runs in (None: not a pod's process, or it is gone)."""
    try:
        return pod_uid_of_cgroup((proc / str(peer_pid(conn)) / "cgroup").read_text())
    except OSError:
        return None
