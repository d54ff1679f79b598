"""The `kubernetes` Service for pods on the real node (tools/k8s/node.py): its ClusterIP
and port, forwarded in user space to the API server on loopback, as kube-proxy's first
mode did. Pods find the API server where every pod does (KUBERNETES_SERVICE_HOST and
_PORT, set by the kubelet) and check its certificate, which names the ClusterIP.

kube-proxy itself is not run: its rules would be the whole machine's iptables, and no
rule can send a pod's packets to a loopback address. Stdlib only.

    python service_proxy.py LISTEN_HOST LISTEN_PORT TARGET_HOST TARGET_PORT
"""

from __future__ import annotations

import asyncio
import contextlib
import sys


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except ConnectionError:
        pass
    finally:
        writer.close()


async def serve(listen: tuple[str, int], target: tuple[str, int]) -> None:
    async def connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*target)
        except OSError:
            writer.close()
            return
        # Either side closing ends both: HTTP over TLS has no use for a half-open pipe.
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))

    server = await asyncio.start_server(connect, *listen)
    async with server:
        await server.serve_forever()


def main(argv: list[str]) -> int:
    listen_host, listen_port, target_host, target_port = argv
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve((listen_host, int(listen_port)), (target_host, int(target_port))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
