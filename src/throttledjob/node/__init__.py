"""The GPU node agent (`throttledjob node`): the one process on a GPU node that reads
every GPU and may cap one, serving each pod's sidecar its own GPUs and no others.

identity.py  who is asking: the pod of the process at the other end of the socket
caps.py      the power caps set on the node's GPUs, kept on disk and put back
server.py    the answers (read, range, cap, restore) and the Unix socket they go over

The sidecar's side of the socket is sidecar/gpu/node_backend.py.
"""
