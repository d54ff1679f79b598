"""Fake GPUs on the test cluster's real node, the way a real cluster gets them: a device
plugin (the kubelet's device plugin API, v1beta1) registering `nvidia.com/gpu` with the
simulated board's UUIDs (gpu/fake.py: fake_uuid). Pods request `nvidia.com/gpu: 1`
and the kubelet allocates one, as on a GPU node; the allocated container is told its
GPU as the NVIDIA device plugin tells it (NVIDIA_VISIBLE_DEVICES). No device files: the
node agent's simulated board is the GPU.

    make cluster WITH=fake-gpus      # or, beside a running cluster:
    .venv/bin/python -m tools.k8s.fake_gpus [--count 2] [--replicas 1]

`--replicas N` shares each GPU N ways, as NVIDIA's plugin does with time-slicing: each
GPU is advertised as N devices `<UUID>::<i>`, and a container given one is told the GPU's
own UUID.

The kubelet serves its registration in /var/lib/kubelet/device-plugins, whatever its
--root-dir (the path is compiled in: pluginapi.DevicePluginPath).

Re-registers when the kubelet restarts (it removes every plugin socket when it starts).
"""

from __future__ import annotations

import argparse
import threading
import time
from concurrent import futures
from pathlib import Path

import grpc

from throttledjob.contracts.names import GPU_RESOURCE as RESOURCE
from throttledjob.gpu.fake import fake_uuid
from tools.k8s.kubelet import deviceplugin_pb2 as pb
from tools.k8s.kubelet import deviceplugin_pb2_grpc as rpc

ENDPOINT = "throttledjob-fake-gpu.sock"
PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")


def device_ids(count: int, replicas: int = 1) -> list[str]:
    """The device IDs advertised: the GPUs' UUIDs, or N replicas of each, `<UUID>::<i>`."""
    uuids = [fake_uuid(i) for i in range(count)]
    return uuids if replicas == 1 else [f"{u}::{i}" for u in uuids for i in range(replicas)]


class FakeGpus(rpc.DevicePluginServicer):
    def __init__(self, count: int, replicas: int = 1) -> None:
        self.ids = device_ids(count, replicas)
        self.stopped = threading.Event()

    def GetDevicePluginOptions(self, request, context):
        return pb.DevicePluginOptions()

    def ListAndWatch(self, request, context):
        yield pb.ListAndWatchResponse(
            devices=[pb.Device(ID=d, health="Healthy") for d in self.ids])
        while context.is_active() and not self.stopped.wait(1.0):
            pass

    def Allocate(self, request, context):
        return pb.AllocateResponse(container_responses=[
            pb.ContainerAllocateResponse(envs={"NVIDIA_VISIBLE_DEVICES": ",".join(
                dict.fromkeys(d.split("::", 1)[0] for d in r.devices_ids))})
            for r in request.container_requests])

    def GetPreferredAllocation(self, request, context):
        return pb.PreferredAllocationResponse()

    def PreStartContainer(self, request, context):
        return pb.PreStartContainerResponse()


def start(plugin_dir: Path, count: int, replicas: int = 1) -> tuple[grpc.Server, FakeGpus]:
    """Serve the plugin in `plugin_dir` (the kubelet's device-plugins directory) and
    register it with the kubelet there."""
    gpus = FakeGpus(count, replicas)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    rpc.add_DevicePluginServicer_to_server(gpus, server)
    (plugin_dir / ENDPOINT).unlink(missing_ok=True)
    server.add_insecure_port(f"unix://{plugin_dir / ENDPOINT}")
    server.start()
    register(plugin_dir)
    return server, gpus


def register(plugin_dir: Path) -> None:
    with grpc.insecure_channel(f"unix://{plugin_dir / 'kubelet.sock'}") as channel:
        rpc.RegistrationStub(channel).Register(
            pb.RegisterRequest(version="v1beta1", endpoint=ENDPOINT, resource_name=RESOURCE),
            timeout=10)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plugin-dir", type=Path, default=PLUGIN_DIR)
    parser.add_argument("--count", type=int, default=2)
    parser.add_argument("--replicas", type=int, default=1,
                        help="devices per GPU (time-slicing: <UUID>::<i>)")
    args = parser.parse_args(argv)
    plugin_dir = args.plugin_dir
    while True:
        server, gpus = start(plugin_dir, args.count, args.replicas)
        print(f"registered {len(gpus.ids)} fake {RESOURCE} with the kubelet", flush=True)
        # The kubelet removes our socket when it restarts: serve again and register.
        while (plugin_dir / ENDPOINT).exists():
            time.sleep(1.0)
        gpus.stopped.set()
        server.stop(grace=1).wait()


if __name__ == "__main__":
    raise SystemExit(main())
