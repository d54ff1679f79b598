"""The kubelet's PodResources API (v1), as generated from its own definition.

podresources.proto is k8s.io/kubelet v0.37.2's pkg/apis/podresources/v1/api.proto, renamed
so that its Python module path is this package's; the stubs beside it were generated from
it, unedited, by grpcio-tools 1.85.1 (protobuf 7.36.2 at run time), from a directory laid
out as the package:

    python -m grpc_tools.protoc -I. --python_out=. --grpc_python_out=. \\
        throttledjob/node/kubelet/podresources.proto
"""
