"""The test cluster, built from source and run on this machine (docs/dev/testing.md).

    host      what the machine offers: cgroup hierarchies, free ports, commands, the cache
    cluster   the control plane and KWOK's node (`python -m tools.k8s.cluster up|down`)
    node      a real node beside it: kubelet, containerd, its network and cgroups
    images    the images a real node runs, built here (no registry is reachable)
    dns       the cluster's DNS (CoreDNS) for a real node's pods
    batch     Kueue and JobSet beside the control plane, on request

Imports go one way: cluster -> node -> images, dns -> host; cluster -> batch -> host.
"""
