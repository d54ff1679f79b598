"""Moved: the GPU device layer is throttledjob.gpu, the sidecar's GPU control loop
sidecar/gpu_*.py. Only `throttledjob.sidecar.gpu.fake` is left here, as an alias of
throttledjob.gpu.fake, until tests/cluster/ import it from there; then delete this package.
"""
