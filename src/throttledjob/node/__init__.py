"""The GPU node agent (`throttledjob node`): the one process on a GPU node that reads
every GPU and may cap one, serving each pod's sidecar its own GPUs and no others.

identity.py         who is asking: the pod of the process at the other end of the socket
caps.py             the power caps set on the node's GPUs, kept on disk and put back
socket_protocol.py  the answers (read, range, cap, restore) and the Unix socket they go over
csi.py              the CSI node driver: the kubelet's publish and unpublish of each pod's
                    volume
process.py          the wiring, the tidying pass, SIGTERM (docs/reliability.md, "the order
                    of failure"); metrics.py its /metrics; probe.py its liveness probe

The sidecar's side of the socket is gpu/node_backend.py.
"""
