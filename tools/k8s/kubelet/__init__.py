"""The kubelet's device plugin API (v1beta1), for the test cluster's fake GPUs
(tools/k8s/fake_gpus.py), as generated from its own definition.

deviceplugin.proto is k8s.io/kubelet v0.37.2's pkg/apis/deviceplugin/v1beta1/api.proto,
renamed so that its Python module path is this package's; the stubs beside it were
generated from it, unedited, by grpcio-tools 1.85.1, from a directory laid out as the
package:

    python -m grpc_tools.protoc -I. --python_out=. --grpc_python_out=. \\
        tools/k8s/kubelet/deviceplugin.proto
"""
