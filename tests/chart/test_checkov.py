"""checkov's Kubernetes checks on what reaches a cluster: the chart rendered with the
defaults and with every optional part on, and a Job the operator builds.

checkov lives in a venv of its own (.venv-checkov, `make checkov`): its dependencies clash
with the suite's pins. Every check that still fails is listed, with why, in
docs/reliability.md ("checkov findings"); the test wants exactly that list, so a new
finding fails it, and so does a fixed one left in the docs.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import yaml

from testing.chart import ALL_ON, MONITORING_APIS, helm
from testing.helpers import require_tool
from testing.manifests import operator_job
from testing.paths import ROOT

CHECKOV = ROOT / ".venv-checkov" / "bin" / "checkov"
DOC = ROOT / "docs" / "reliability.md"
DIGEST = "sha256:" + "0" * 64

# A workload template that passes checkov on its own (digest, pull policy, limits, a
# read-only root, a high UID), so what remains on the built Job is the operator's doing.
CLEAN_WORKLOAD = {
    "securityContext": {"runAsNonRoot": True, "runAsUser": 10001, "runAsGroup": 10001,
                        "seccompProfile": {"type": "RuntimeDefault"}},
    "containers": [{
        "name": "trainer", "image": f"registry.example.com/train@{DIGEST}",
        "imagePullPolicy": "Always", "command": ["python", "train.py"],
        "resources": {"requests": {"cpu": "1", "memory": "1Gi"},
                      "limits": {"cpu": "2", "memory": "1Gi"}},
        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                            "runAsNonRoot": True, "runAsUser": 10001,
                            "capabilities": {"drop": ["ALL"]}}}],
}

# Each scan is one "cluster": checkov's graph checks (a NetworkPolicy selecting a pod)
# look across the files of one directory.
SCANS: dict[str, tuple[list[str], dict[str, Any]]] = {
    "defaults": ([], {"inject": "None"}),
    "all-on": ([f"--set-json={k}={json.dumps(v)}" for k, v in {
        **ALL_ON, "watchNamespaces": ["ml"], "image": {"digest": DIGEST}}.items()],
        {"inject": "Auto"}),
}


def checkov() -> str:
    if CHECKOV.exists():
        return str(CHECKOV)
    return require_tool("checkov")  # missing: a failure under CI=true, else a skip


def makefile_pin() -> str:
    (version,) = re.findall(r"^CHECKOV_VERSION\s*:?=\s*(\S+)",
                            (ROOT / "Makefile").read_text(), re.M)
    return version


def justified() -> dict[str, str]:
    """check ID -> the row of docs/reliability.md's "checkov findings" table."""
    section = DOC.read_text().split("### checkov findings", 1)[1].split("\n#", 1)[0]
    rows = {}
    for line in section.splitlines():
        m = re.match(r"^\| `(CKV2?_K8S_\d+)` \|(.*)\|$", line)
        if m:
            assert m.group(1) not in rows, f"{m.group(1)} listed twice"
            cells = [c.strip() for c in m.group(2).split("|")]
            assert len(cells) == 2 and all(cells), f"{line}: what it wants, and why"
            rows[m.group(1)] = line
    return rows


def operator_settings(objs: list[dict[str, Any]]) -> Any:
    """The settings the rendered operator runs with: its environment and sidecar image."""
    from throttledjob.operator.config import OperatorSettings

    (deploy,) = [o for o in objs if o["kind"] == "Deployment"]
    (c,) = deploy["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e["value"] for e in c["env"]}
    (image,) = [a.split("=", 1)[1] for a in c["args"] if a.startswith("--sidecar-image=")]
    return OperatorSettings.from_env({**env, "THROTTLEDJOB_SIDECAR_IMAGE": image})


def write_scan(directory: Path, chart_args: list[str], job_kw: dict[str, Any]) -> None:
    """The chart as rendered, and the Job its operator would build, in one directory."""
    directory.mkdir()
    rendered = helm("template", "tj", str(ROOT / "charts" / "throttledjob"),
                    "--namespace", "throttledjob-system", "--include-crds",
                    *MONITORING_APIS, *chart_args).stdout
    (directory / "chart.yaml").write_text(rendered)
    settings = operator_settings([d for d in yaml.safe_load_all(rendered) if d])
    job = operator_job(**job_kw, settings=settings, **CLEAN_WORKLOAD)
    (directory / "job.yaml").write_text(yaml.safe_dump(job))


def test_checkov_finds_only_the_justified_checks(tmp_path: Path) -> None:
    exe = checkov()
    procs = {}
    for name, (chart_args, job_kw) in SCANS.items():
        write_scan(tmp_path / name, chart_args, job_kw)
        procs[name] = subprocess.Popen(
            [exe, "--directory", str(tmp_path / name), "--framework", "kubernetes",
             "--output", "json", "--compact", "--quiet", "--skip-download"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    failed: dict[str, set[str]] = {}
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=180)
        assert proc.returncode in (0, 1), err  # 1: some check failed
        report = json.loads(out)
        assert report["summary"]["checkov_version"] == makefile_pin()
        assert report["summary"]["parsing_errors"] == 0, err
        # The scan saw the objects: the chart's and the built Job.
        assert report["summary"]["resource_count"] >= 8, report["summary"]
        for check in report["results"]["failed_checks"]:
            failed.setdefault(check["check_id"], set()).add(f"{name}: {check['resource']}")
    documented = justified()
    new = {c: sorted(where) for c, where in failed.items() if c not in documented}
    fixed = sorted(set(documented) - set(failed))
    assert not new, f"checkov findings not justified in docs/reliability.md: {new}"
    assert not fixed, f"listed in docs/reliability.md but no longer found: {fixed}"
    # "Defaults only": the values that switch everything on (image.digest,
    # networkPolicy.enabled) fix it, as the row says.
    for check, row in documented.items():
        if "| Defaults only" in row:
            assert not [w for w in failed[check] if not w.startswith("defaults:")], row
