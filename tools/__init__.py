"""The project's own tooling: the test cluster (`tools.k8s`) and the dashboard generator.

A package so that tests and benchmarks import it the usual way from the repository root
(`pythonpath = ["."]` for pytest, `python -m` for scripts); nothing here is shipped.
"""
