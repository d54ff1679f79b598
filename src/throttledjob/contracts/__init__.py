"""The contracts between ThrottledJob's parts, and nothing else: stdlib only, no I/O.

- `names`: environment variables and file names the parts agree on.
- `policy`: the throttle policy (`spec.throttle`, `--policy FILE`), read by the operator,
  the sidecar and local mode.
- `settings`: the settings file, sidecar -> workload.
- `progress`: the progress files, workload -> sidecar.
- `status`: the `/status` document, sidecar -> operator.

The runtime library's injected copy carries this package too, so the workload side of
each contract is the same code as the sidecar's.
"""
