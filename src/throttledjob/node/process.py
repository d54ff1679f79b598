"""`throttledjob node`: the node agent's process, wiring the parts together.

- GPUs: NVML (`--gpu-backend nvml`), or the simulated board (`fake`, the test cluster's
  fake GPUs: its UUIDs are the fake device plugin's).
- Who holds which GPU: the kubelet's PodResources API (pod_resources.py), read at most
  once a second.
- Each pod's socket: made when the kubelet publishes the pod's CSI volume (csi.py); when
  it unpublishes it, the pod's caps are put back first, then the socket is closed. The
  volumes published are kept in the state directory beside the caps, so a restarted agent
  serves them again.
- Every TIDY_SECONDS, and at start: caps of pods not served (their volume gone: the
  agent's own state, no kubelet needed), then caps whose pods the kubelet no longer lists
  with that GPU, are put back. SIGTERM or SIGINT (handled from the first instruction:
  cli.py): no cap is set any more, every cap is put back, then the agent exits. A cap
  asked by a pod whose volume went is refused.
- `/metrics` on `--metrics-port` (metrics.py): each GPU's limit, the original of a capped
  one (and with `--metrics-pod-names`, the pods holding them), on a bounded server.
- Liveness: the CSI driver's Probe fails once no tidying pass ran for a while (probe.py
  is the kubelet's exec probe: a real round trip through the driver's socket).

The order of failure (docs/reliability.md, "The node agent's restores"): a restore needs
the board and nothing else; no new file descriptor, thread, kubelet answer or metrics
scrape stands before it.
"""

from __future__ import annotations

import contextlib
import logging
import resource
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

import grpc

from throttledjob.gpu.backend import GpuBackend
from throttledjob.runtime.files import read_json_bounded, write_json_atomic

from .caps import STATE_MAX_BYTES, CapKeeper
from .csi import SOCKET_NAME, OneVolumeAPod, serve_csi
from .identity import PodRef
from .pod_resources import gpus_by_pod
from .pod_resources import socket_path as pod_resources_socket
from .socket_protocol import NodeAgent, serve, shared_gpus

TIDY_SECONDS = 5.0
ASSIGNMENTS_TTL_SECONDS = 1.0
# Under the sidecar's own 2 s for an answer (gpu/node_backend.py): a kubelet slower than this
# counts as not answering, and the last answer stands.
KUBELET_TIMEOUT_SECONDS = 1.0
# Not alive once no tidying pass ran for this long (the liveness probe restarts it).
STALE_SECONDS = 4 * TIDY_SECONDS
# A pod still served (its volume published) that the kubelet lists without its GPU keeps
# its cap this long: a kubelet just restarted lists pods before their devices (a running
# pod's cap was put back so, in CI). A pod truly gone is unpublished, which puts its caps
# back at once; this bounds the case where the kubelet never unpublishes it.
GONE_GRACE_SECONDS = 30.0
log = logging.getLogger("throttledjob.node")


class Node:
    def __init__(self, backend: GpuBackend, kubelet_dir: Path, state_dir: Path,
                 list_gpus: Callable[[], Mapping[str, frozenset[str]]] | None = None) -> None:
        """`list_gpus`: who holds which GPU (default: the kubelet's PodResources under
        `kubelet_dir`); raises grpc.RpcError where it cannot tell."""
        state_dir.mkdir(parents=True, exist_ok=True)
        socket = pod_resources_socket(kubelet_dir)
        self.list_gpus = list_gpus or (
            lambda: gpus_by_pod(socket, timeout_seconds=KUBELET_TIMEOUT_SECONDS))
        self.volumes_path = state_dir / "volumes.json"
        self.keeper = CapKeeper(backend, state_dir / "caps.json")
        self.agent = NodeAgent(backend, self.keeper, self.assignments, serving=self.serving)
        self.listeners: dict[Path, tuple[Any, PodRef]] = {}
        self.leaving: set[str] = set()   # UIDs of pods being unpublished: served no more
        self.tidied = time.monotonic()   # when the last tidying pass ended
        # (pod key, GPU) of a served pod's cap the kubelet last listed without: since when.
        self._unlisted: dict[tuple[str, str], float] = {}
        self._lock = threading.Lock()
        self._listing = threading.Lock()
        self._assigned: tuple[float, Mapping[str, frozenset[str]]] = (-1e9, {})

    def assignments(self) -> Mapping[str, frozenset[str]]:
        """Who holds which GPU, as the kubelet last said. While it does not answer (it
        restarts), its last answer stands: no allocation changes meanwhile, and a pod's
        sidecar told "no GPU of this pod" would run CPU-only until it asked again."""
        with self._listing:   # one call to the kubelet at a time; the rest use its answer
            at, assigned = self._assigned
            if time.monotonic() - at <= ASSIGNMENTS_TTL_SECONDS:
                return assigned
            listed = self._listed()
            return assigned if listed is None else listed

    def _listed(self) -> Mapping[str, frozenset[str]] | None:
        """The kubelet's answer now, kept as the last one (None: it did not answer; the
        last one is kept for another ASSIGNMENTS_TTL_SECONDS, not asked for again by every
        request meanwhile)."""
        try:
            assigned = self.list_gpus()
        except grpc.RpcError as e:
            log.warning("throttledjob node: the kubelet's PodResources did not answer (%s)",
                        e.code())
            self._assigned = (time.monotonic(), self._assigned[1])
            return None
        self._assigned = (time.monotonic(), assigned)
        return assigned

    def publish(self, directory: Path, pod: PodRef) -> None:
        with self._lock:
            if directory in self.listeners:   # the kubelet may publish a volume again
                return
            if any(p.uid == pod.uid for _, p in self.listeners.values()):
                # A second volume of the driver in one pod (its own attributes, written
                # in a ThrottledJob's template): refused, the pod's containers never start.
                raise OneVolumeAPod(f"pod {pod.key} has a volume of this driver already: "
                                    "a pod gets one, the operator's")
            server = serve(directory / SOCKET_NAME, self.agent, pod)
            # Listed before it serves: a first request must find its pod served.
            self.listeners[directory] = (server, pod)
            try:
                threading.Thread(target=server.serve_forever, args=(0.2,),
                                 daemon=True).start()
            except RuntimeError:   # no thread to be had: nothing listed, nothing left open
                del self.listeners[directory]
                server.close()
                raise
            self._save_volumes()
        log.info("throttledjob node: serving pod %s", pod.key)

    def served(self) -> list[PodRef]:
        """The pods whose volume is published and not being unpublished."""
        with self._lock:
            return [p for _, p in self.listeners.values() if p.uid not in self.leaving]

    def serving(self, pod: PodRef) -> bool:
        """`pod` is served (by UID: a pod of the same name may follow it)."""
        return any(p.uid == pod.uid for p in self.served())

    def unpublish(self, directory: Path) -> None:
        """The pod's caps first (its volume goes: it is ending), and nothing before them
        that could fail: marked as leaving (in memory: a request in flight caps nothing
        from here), restored, then its socket closed and the volume forgotten. A file
        that cannot be written here is written at the next change."""
        with self._lock:
            server, pod = self.listeners.get(directory, (None, None))
            if pod is not None:
                self.leaving.add(pod.uid)
        if pod is not None:
            self.keeper.restore_pod(pod.uid)
            server.close()
        with contextlib.suppress(OSError):
            (directory / SOCKET_NAME).unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            directory.rmdir()
        with self._lock:
            self.listeners.pop(directory, None)
            if pod is not None:
                self.leaving.discard(pod.uid)
            try:
                self._save_volumes()
            except OSError as e:
                log.error("throttledjob node: cannot write %s (%s)", self.volumes_path, e)
        if pod is not None:
            log.info("throttledjob node: pod %s gone", pod.key)

    def resume(self) -> None:
        """Serve again the volumes published before a restart, where they still are. A
        file that cannot be read (a crash before it reached the disk) is set aside with one
        line in the log, as caps.json is, not a crash at every start: the kubelet's next
        publish of those volumes serves them again."""
        if not self.volumes_path.exists():
            return
        try:
            volumes = {Path(path): PodRef(**pod) for path, pod in read_json_bounded(
                str(self.volumes_path), STATE_MAX_BYTES).items()}
        except (OSError, ValueError, TypeError, AttributeError) as e:
            aside = self.volumes_path.with_suffix(".bad")
            self.volumes_path.replace(aside)
            log.error("throttledjob node: %s unreadable (%s), moved to %s: the pods' volumes "
                      "published before are not served again", self.volumes_path, e, aside)
            return
        for path, pod in volumes.items():
            if path.is_dir():
                try:
                    self.publish(path, pod)
                except (OSError, RuntimeError) as e:   # one volume's socket, not the agent
                    log.warning("throttledjob node: cannot serve pod %s again: %s", pod.key, e)

    def tidy(self) -> None:
        """Put back the caps of pods not served (the agent's own state alone), then those
        of pods the kubelet no longer lists with their GPU and of GPUs it lists for
        several pods (where it answers). Never raises: the agent must outlive a bad pass."""
        try:
            self.keeper.restore_unserved(self.served())
            with self._listing:
                live = self._listed()
            if live is not None:
                self.keeper.restore_gone(self._with_grace(live), shared_gpus(live))
            self.keeper.flush()
        except Exception:   # logged whole, tried again at the next pass
            log.exception("throttledjob node: a tidying pass failed")
        self.tidied = time.monotonic()

    def _with_grace(self, live: Mapping[str, frozenset[str]]) -> dict[str, frozenset[str]]:
        """The kubelet's listing, where a served pod's capped GPU it lacks is kept for
        GONE_GRACE_SECONDS from the first listing without it."""
        now, served = time.monotonic(), {p.key for p in self.served()}
        out, unlisted = dict(live), {}
        for uuid, cap in list(self.keeper.caps.items()):
            if cap.pod in served and uuid not in live.get(cap.pod, frozenset()):
                since = unlisted[(cap.pod, uuid)] = self._unlisted.get((cap.pod, uuid), now)
                if now - since < GONE_GRACE_SECONDS:
                    out[cap.pod] = out.get(cap.pod, frozenset()) | {uuid}
        self._unlisted = unlisted
        return out

    def health(self) -> str | None:
        """Why the agent is not alive (None: it is): its tidying passes stopped."""
        late = time.monotonic() - self.tidied
        return None if late <= STALE_SECONDS else \
            f"no tidying pass for {late:.0f} s: the agent is wedged"

    def stop(self) -> None:
        """Every cap put back, with no cap set from then on (the keeper refuses them, which
        a request in flight may still ask), then no pod served any more. The caps first:
        nothing a server does can stand before them."""
        self.keeper.stop()
        with self._lock:
            servers = [server for server, _ in self.listeners.values()]
        for server in servers:
            server.close()

    def _save_volumes(self) -> None:
        write_json_atomic(str(self.volumes_path),
                          {str(d): asdict(pod) for d, (_, pod) in self.listeners.items()})


def raise_open_file_limit() -> None:
    """The soft limit of open files up to the hard one (often 1,024 of 524,288 in a
    container): the agent holds a socket per pod and per connection."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def run_node(backend: GpuBackend, kubelet_dir: Path, node_name: str, state_dir: Path,
             stopping: threading.Event, metrics_port: int = 0,
             metrics_pod_names: bool = False) -> int:
    """`stopping`: set by SIGTERM or SIGINT, whose handlers the caller installed first."""
    raise_open_file_limit()
    node = Node(backend, kubelet_dir, state_dir)
    node.resume()
    node.tidy()
    if metrics_port:
        from .metrics import serve_metrics

        serve_metrics(node, metrics_port, metrics_pod_names)
    csi = serve_csi(kubelet_dir, node_name, node.publish, node.unpublish, node.health)
    log.info("throttledjob node: %s; the CSI driver registered with the kubelet", node_name)
    while not stopping.wait(TIDY_SECONDS):
        node.tidy()
    node.stop()
    csi.stop(grace=2).wait()
    backend.close()
    return 0
