"""Benchmarks (docs/dev/benchmarks.md). Run from the repository root as modules, e.g.
`python -m bench.run`, so that they import the test support (`testing`) and the test
cluster's tooling (`tools.k8s`) the usual way. tests/bench/ runs each at a tiny size."""
