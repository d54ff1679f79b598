"""The Prometheus Operator's CRDs of the kinds the chart can render (PodMonitor,
PrometheusRule), as that project publishes them: from its Go module (the Go module proxy
is reachable where no release download is), pinned here. The suite installs them on the
test cluster to see the chart's monitoring objects accepted by their real schemas.
Stdlib only; needs `go` on PATH (make's WITH_GO)."""

from __future__ import annotations

import json
from pathlib import Path

from tools.k8s.host import run

MODULE = "github.com/prometheus-operator/prometheus-operator"
VERSION = "v0.85.0"
KINDS = ("podmonitors", "prometheusrules")


def crd_files() -> list[Path]:
    """The CRD files of KINDS, from the module in GOMODCACHE (downloaded once, 4 MB)."""
    out = run("go", "mod", "download", "-json", f"{MODULE}@{VERSION}", timeout=300).stdout
    directory = Path(json.loads(out)["Dir"]) / "example" / "prometheus-operator-crd"
    return [directory / f"monitoring.coreos.com_{kind}.yaml" for kind in KINDS]
