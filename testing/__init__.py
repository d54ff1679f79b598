"""Test support: what tests (and benchmarks) share, imported from the repository root.

Plain modules, one job each; `conftest.py` files keep only fixtures and hooks.

    paths             ROOT, VENV_BIN, HUNGRY (stdlib only: the benchmarks and the demo too)
    helpers           wait_for, require_tool
    processes         state, stopped, stop
    http              free_port, get, get_json
    promserver        a real Prometheus, a real `throttledjob run --metrics-port`
    scrape            the scrape jobs of the chart's PodMonitors, for a Prometheus on the cluster
    validation        the official Kubernetes schemas, the CRD's schema
    manifests         a small ThrottledJob, the Job the operator builds for one
    builders          the operator's children as the handler sends them
    emulator          the kmock API emulator (faults on demand) and what tests read from it
    operator_process  `throttledjob operator` as a child process; a handler's memo
    fake_sidecar      a real HTTP server answering /status
    fake_tree         a process tree whose CPU time the test sets
    chart             `helm template` of the chart, Pod Security "restricted"
    rbac              the API calls the operator makes, as RBAC rules
    dashboard         the dashboard's queries, variables filled in
    monitoring_schemas  the monitoring CRDs' schemas the chart's objects are checked against
    cluster_cli       kubectl and helm on the test cluster, and what tests read through them
    node_samples      a real node's pods: "restricted" specs, their containers' cgroups sampled
    sidecar_process   a real `throttledjob sidecar` the tests started
    workloads         the long CPU-hungry workload and its process tree
    benchmarks        a benchmark of bench/ run as `make bench` runs it, its tables read
"""
