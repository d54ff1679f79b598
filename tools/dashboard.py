"""Generate the ThrottledJob Grafana dashboard: the one source of its JSON.

    python tools/dashboard.py            # write the chart's copy and the standalone copy
    python tools/dashboard.py --check    # exit 1 if either file differs from this source

Writes charts/throttledjob/dashboards/throttledjob.json (the chart's ConfigMap globs it)
and docs/grafana-dashboard.json (to import by hand). tests/chart/test_dashboard.py runs
every query below, variables filled in, against a real Prometheus scraping a real sidecar,
so a metric renamed in sidecar/metrics.py fails there. Metric reference: docs/metrics.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
OUTPUTS = (ROOT / "charts" / "throttledjob" / "dashboards" / "throttledjob.json",
           ROOT / "docs" / "grafana-dashboard.json")
UID = "throttledjob-overview"
DS = {"type": "prometheus", "uid": "${datasource}"}
# Series selectors: the PodMonitor labels every series with namespace, throttledjob, pod.
SEL = 'namespace=~"$namespace", throttledjob=~"$throttledjob", pod=~"$pod"'
GSEL = SEL + ', gpu=~"$gpu"'
# The operator's series of a ThrottleBudget (its PodMonitor honours their namespace label).
BSEL = 'namespace=~"$namespace", budget=~"$budget"'
BY = "namespace, throttledjob, pod"
CORES = "suffix: cores"
RATIO = "suffix:\u00d7"  # a slowdown of 1.2x


def target(expr: str, legend: str, ref: str) -> dict[str, Any]:
    return {"datasource": DS, "expr": expr, "legendFormat": legend, "refId": ref}


def _targets(queries: list[tuple[str, str]]) -> list[dict[str, Any]]:
    return [target(e, legend, chr(ord("A") + i)) for i, (e, legend) in enumerate(queries)]


class Layout:
    """Panels flow left to right in a 24-column grid; rows start a new line."""

    def __init__(self) -> None:
        self.panels: list[dict[str, Any]] = []
        self.x = self.y = self.row_height = 0
        self.next_id = 1

    def _place(self, panel: dict[str, Any], w: int, h: int) -> dict[str, Any]:
        if self.x + w > 24:
            self.x, self.y = 0, self.y + self.row_height
            self.row_height = 0
        panel = {"id": self.next_id, "gridPos": {"x": self.x, "y": self.y, "w": w, "h": h},
                 **panel}
        self.next_id += 1
        self.x += w
        self.row_height = max(self.row_height, h)
        self.panels.append(panel)
        return panel

    def row(self, title: str) -> None:
        if self.x:
            self.x, self.y, self.row_height = 0, self.y + self.row_height, 0
        self._place({"type": "row", "title": title, "collapsed": False, "panels": []}, 24, 1)
        self.x, self.y, self.row_height = 0, self.y + 1, 0

    def stat(self, title: str, description: str, expr: str, legend: str, unit: str,
             w: int = 4, decimals: int = 2, mappings: list[dict[str, Any]] | None = None,
             thresholds: list[dict[str, Any]] | None = None) -> None:
        self._place({
            "type": "stat", "title": title, "description": description, "datasource": DS,
            "targets": _targets([(expr, legend)]),
            "fieldConfig": {"defaults": {
                "unit": unit, "decimals": decimals, "mappings": mappings or [],
                "color": {"mode": "thresholds"},
                "thresholds": {"mode": "absolute", "steps": thresholds or [
                    {"color": "blue", "value": None}]}}, "overrides": []},
            "options": {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "",
                                          "values": False},
                        "colorMode": "value", "graphMode": "none", "textMode": "auto",
                        "orientation": "auto", "justifyMode": "auto"},
        }, w, 4)

    def timeseries(self, title: str, description: str, queries: list[tuple[str, str]],
                   unit: str, w: int = 12, h: int = 8, dashed: str | None = None,
                   max_value: float | None = None, stacked: bool = False) -> None:
        """`dashed`: a legend regex drawn as a dashed line (targets beside actual values)."""
        overrides = []
        if dashed:
            overrides.append({
                "matcher": {"id": "byRegexp", "options": dashed},
                "properties": [{"id": "custom.lineStyle",
                                "value": {"fill": "dash", "dash": [10, 10]}},
                               {"id": "custom.fillOpacity", "value": 0}]})
        defaults: dict[str, Any] = {
            "unit": unit, "min": 0,
            "custom": {"drawStyle": "line", "lineWidth": 1, "fillOpacity": 10,
                       "showPoints": "never", "spanNulls": False,
                       "stacking": {"mode": "normal" if stacked else "none", "group": "A"}},
        }
        if max_value is not None:
            defaults["max"] = max_value
        self._place({
            "type": "timeseries", "title": title, "description": description, "datasource": DS,
            "targets": _targets(queries),
            "fieldConfig": {"defaults": defaults, "overrides": overrides},
            "options": {"legend": {"displayMode": "table", "placement": "bottom",
                                   "calcs": ["max", "lastNotNull"]},
                        "tooltip": {"mode": "multi", "sort": "desc"}},
        }, w, h)


def _variable(name: str, label: str, query: str) -> dict[str, Any]:
    return {"name": name, "label": label, "type": "query", "datasource": DS,
            "query": {"query": query, "refId": f"{name}-variable"}, "definition": query,
            "refresh": 2, "includeAll": True, "multi": True, "allValue": ".+",
            "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
            "sort": 1, "hide": 0, "options": [], "regex": ""}


def variables() -> list[dict[str, Any]]:
    return [
        {"name": "datasource", "label": "Data source", "type": "datasource",
         "query": "prometheus", "current": {}, "hide": 0, "refresh": 1, "regex": "",
         "options": [], "includeAll": False, "multi": False},
        _variable("namespace", "Namespace", "label_values(throttledjob_build_info, namespace)"),
        _variable("throttledjob", "ThrottledJob", "label_values(throttledjob_build_info"
                  '{namespace=~"$namespace"}, throttledjob)'),
        _variable("pod", "Pod", 'label_values(throttledjob_build_info{namespace=~"$namespace", '
                  'throttledjob=~"$throttledjob"}, pod)'),
        _variable("gpu", "GPU", f"label_values(throttledjob_gpu_info{{{SEL}}}, gpu)"),
        _variable("budget", "ThrottleBudget", "label_values(throttledjob_operator_budget_cpu_"
                  'cores{namespace=~"$namespace"}, budget)'),
    ]


def panels() -> list[dict[str, Any]]:
    lay = Layout()
    peak = "run-long, from the sidecar's 1-second samples (status.observed of the ThrottledJob)"
    lay.row("Observed peaks, per ThrottledJob")
    lay.stat("CPU peak p99", f"99th percentile of CPU use, {peak}.",
             f'max by (namespace, throttledjob) (throttledjob_workload_cpu_peak_cores{{{SEL}, '
             'stat="p99"})', "{{throttledjob}}", CORES)
    lay.stat("CPU peak max", f"Largest 1-second CPU use, {peak}.",
             f'max by (namespace, throttledjob) (throttledjob_workload_cpu_peak_cores{{{SEL}, '
             'stat="max"})', "{{throttledjob}}", CORES)
    lay.stat("GPU utilization peak p99", f"99th percentile of the busiest GPU, {peak}.",
             f'max by (namespace, throttledjob) (throttledjob_gpu_utilization_peak_ratio{{{SEL}, '
             'stat="p99"})', "{{throttledjob}}", "percentunit")
    lay.stat("GPU power peak p99", f"99th percentile of the busiest GPU's power, {peak}.",
             f'max by (namespace, throttledjob) (throttledjob_gpu_power_peak_watts{{{SEL}, '
             'stat="p99"})', "{{throttledjob}}", "watt", decimals=0)
    lay.stat("Slowdown", "Estimated slowdown so far (wall time over wall time minus time "
             "held back), the largest of the selected pods.",
             f"max by (namespace, throttledjob) (throttledjob_slowdown_estimate_ratio{{{SEL}}})",
             "{{throttledjob}}", RATIO)
    lay.stat("Target met", "Whether the recent p99 of every target is at or under it.",
             f"min by (namespace, throttledjob) (throttledjob_target_met{{{SEL}}})",
             "{{throttledjob}}", "none", decimals=0,
             mappings=[{"type": "value", "options": {
                 "0": {"text": "Missed", "color": "red", "index": 0},
                 "1": {"text": "Met", "color": "green", "index": 1}}}])

    lay.row("CPU")
    lay.timeseries(
        "CPU cores vs target", "CPU used by the workload per pod (rate of its CPU seconds), "
        "its peak target and the quota the actuators hold now.",
        [(f"sum by ({BY}) (rate(throttledjob_workload_cpu_seconds_total{{{SEL}}}"
          "[$__rate_interval]))", "{{pod}} used"),
         (f"throttledjob_cpu_target_cores{{{SEL}}}", "{{pod}} target"),
         (f"throttledjob_cpu_quota_cores{{{SEL}}}", "{{pod}} quota")],
        CORES, w=16, dashed=".* (target|quota)$")
    lay.stat("CPU now", "CPU used over the last control interval, per pod.",
             f"throttledjob_workload_cpu_cores{{{SEL}}}", "{{pod}}", CORES, w=8)

    lay.row("Job-wide: all the pods of a Job")
    lay.timeseries(
        "Job CPU vs job-wide target", "CPU used by all the pods of each ThrottledJob, "
        "summed. Under scope Job the target holds this sum (split among the pods by each "
        "one's cost of a step); under scope Pod it holds each pod alone (see CPU above).",
        [(f"sum by (namespace, throttledjob) (rate(throttledjob_workload_cpu_seconds_total"
          f"{{{SEL}}}[$__rate_interval]))", "{{throttledjob}} used, all pods"),
         (f"max by (namespace, throttledjob) (throttledjob_cpu_target_cores{{{SEL}}})",
          "{{throttledjob}} target")],
        CORES, w=12, dashed=".* target$")
    lay.timeseries(
        "Ranks: steps per second", "Each pod's pace, as its workload reports steps. In a "
        "data-parallel job every rank should keep the same pace: one below the others is "
        "the straggler the job waits for.",
        [(f"throttledjob_workload_steps_per_second{{{SEL}}}", "{{pod}}")], "none", w=12)

    lay.row("GPU")
    lay.timeseries(
        "GPU utilization vs target", "Fraction of time a kernel ran, per GPU, and the "
        "utilization target.",
        [(f"throttledjob_gpu_utilization_ratio{{{GSEL}}}", "{{pod}} GPU {{gpu}}"),
         (f"throttledjob_gpu_utilization_target_ratio{{{SEL}}}", "{{pod}} target")],
        "percentunit", dashed=".* target$", max_value=1)
    lay.timeseries(
        "GPU power vs target", "Power draw per GPU, the power target and the enforced "
        "power limit.",
        [(f"throttledjob_gpu_power_watts{{{GSEL}}}", "{{pod}} GPU {{gpu}}"),
         (f"throttledjob_gpu_power_target_watts{{{SEL}}}", "{{pod}} target"),
         (f"throttledjob_gpu_power_limit_watts{{{GSEL}}}", "{{pod}} GPU {{gpu}} limit")],
        "watt", dashed=".* (target|limit)$")
    lay.timeseries(
        "GPU memory", "Device memory used and installed, per GPU.",
        [(f"throttledjob_gpu_memory_used_bytes{{{GSEL}}}", "{{pod}} GPU {{gpu}} used"),
         (f"throttledjob_gpu_memory_total_bytes{{{GSEL}}}", "{{pod}} GPU {{gpu}} total")],
        "bytes", w=8, dashed=".* total$")
    lay.timeseries(
        "GPU memory vs fraction target", "Memory used over installed, per GPU, and the "
        "memory fraction the workload is told to cap itself at.",
        [(f"throttledjob_gpu_memory_used_ratio{{{GSEL}}}", "{{pod}} GPU {{gpu}}"),
         (f"throttledjob_gpu_memory_fraction_target_ratio{{{SEL}}}", "{{pod}} target")],
        "percentunit", w=8, dashed=".* target$", max_value=1)
    lay.timeseries(
        "GPU temperature and clock throttling", "Die temperature per GPU; clock throttle "
        "reasons in force (1) are listed in the legend.",
        [(f"throttledjob_gpu_temperature_celsius{{{GSEL}}}", "{{pod}} GPU {{gpu}}"),
         (f"max by ({BY}, gpu, reason) (throttledjob_gpu_clock_throttle_reason{{{GSEL}}})"
          " * 100", "{{pod}} GPU {{gpu}} {{reason}} (x100)")],
        "celsius", w=8)

    lay.row("Control")
    lay.timeseries(
        "Throttle level", "Fraction of the last interval the workload was held back, and "
        "the hold-back the GPU controller asks for.",
        [(f"throttledjob_throttle_level_ratio{{{SEL}}}", "{{pod}} throttle level"),
         (f"throttledjob_gpu_duty_ratio{{{SEL}}}", "{{pod}} GPU duty")],
        "percentunit", w=8, max_value=1)
    lay.timeseries(
        "Time held back, by lever", "Fraction of wall time each lever held the workload "
        "back (signals: SIGSTOP/SIGCONT; pacing: the runtime library's step()). Not "
        "stacked: levers hold the workload back at the same time.",
        [(f"sum by ({BY}, lever) (rate(throttledjob_paused_seconds_total{{{SEL}}}"
          "[$__rate_interval]))", "{{pod}} {{lever}}")],
        "percentunit", w=8)
    lay.timeseries(
        "Levers in use", "1 for each lever the controller uses.",
        [(f"max by ({BY}, lever) (throttledjob_lever_active{{{SEL}}})", "{{pod}} {{lever}}")],
        "none", w=8, max_value=1)
    lay.timeseries(
        "Throughput", "Steps per second reported through the runtime library (tj.step()).",
        [(f"sum by ({BY}) (rate(throttledjob_workload_steps_total{{{SEL}}}"
          "[$__rate_interval]))", "{{pod}} steps/s"),
         (f"throttledjob_workload_steps_per_second{{{SEL}}}", "{{pod}} recent (sidecar)")],
        "suffix: steps/s")
    lay.timeseries(
        "Slowdown vs budget", "Estimated slowdown so far and maxSlowdown.",
        [(f"throttledjob_slowdown_estimate_ratio{{{SEL}}}", "{{pod}} slowdown"),
         (f"throttledjob_slowdown_budget_ratio{{{SEL}}}", "{{pod}} budget")],
        RATIO, dashed=".* budget$")

    fleet(lay)

    lay.row("Sidecar")
    lay.timeseries(
        "Sidecar health", "Scrape success, problems in force and whether the slowdown "
        "budget stops a target from being met.",
        [(f"up{{{SEL}}}", "{{pod}} up"),
         (f"max by ({BY}, kind) (throttledjob_problem{{{SEL}}})", "{{pod}} problem {{kind}}"),
         (f"throttledjob_budget_exhausted{{{SEL}}}", "{{pod}} budget exhausted")],
        "none", w=8, max_value=1)
    lay.timeseries(
        "Control cycle", "Duration of the sidecar's last control cycle.",
        [(f"throttledjob_cycle_duration_seconds{{{SEL}}}", "{{pod}}")], "s", w=8)
    lay.timeseries(
        "Sidecar footprint", "CPU the sidecar process itself uses.",
        [(f"rate(process_cpu_seconds_total{{{SEL}}}[$__rate_interval])", "{{pod}}")],
        CORES, w=8)
    return lay.panels


def _of_members(expr: str) -> str:
    """`expr`, one series per (namespace, throttledjob), kept for the selected budgets'
    members and labelled with the budget: a member of two budgets shows under each."""
    return (f"throttledjob_operator_budget_share_cpu_cores{{{BSEL}, throttledjob=~"
            f'"$throttledjob"}} * 0 + on (namespace, throttledjob) group_left () ({expr})')


def fleet(lay: Layout) -> None:
    """The ThrottleBudgets (docs/budget.md): the budget, the members' measured use against
    it, each member's share of it and what the share costs them."""
    lay.row("Fleet: ThrottleBudgets")
    used = (f"sum by (namespace, throttledjob) (rate(throttledjob_workload_cpu_seconds_total"
            f"{{{SEL}}}[$__rate_interval]))")
    lay.timeseries(
        "Budget vs members' CPU", "Each ThrottleBudget's CPU peak in force (its schedule "
        "and signal applied) and its members' CPU, summed from their sidecars.",
        [(f"throttledjob_operator_budget_cpu_cores{{{BSEL}}}", "{{budget}} budget"),
         (f"sum by (namespace, budget) ({_of_members(used)})", "{{budget}} used")],
        CORES, w=8, dashed=".* budget$")
    lay.timeseries(
        "Members' shares", "Each member's part of the budget, job-wide, as the last split "
        "gave it: stacked, they add up to the budget (or its members' own targets).",
        [(f"throttledjob_operator_budget_share_cpu_cores{{{BSEL}, "
          'throttledjob=~"$throttledjob"}', "{{budget}}: {{throttledjob}}")],
        CORES, w=8, stacked=True)
    slowdown = (f"max by (namespace, throttledjob) (throttledjob_slowdown_estimate_ratio"
                f"{{{SEL}}})")
    allowed = (f"max by (namespace, throttledjob) (throttledjob_slowdown_budget_ratio"
               f"{{{SEL}}})")
    lay.timeseries(
        "Members' slowdown vs maxSlowdown", "What its share costs each member: its "
        "estimated slowdown so far, and its maxSlowdown.",
        [(_of_members(slowdown), "{{budget}}: {{throttledjob}} slowdown"),
         (_of_members(allowed), "{{budget}}: {{throttledjob}} maxSlowdown")],
        RATIO, w=8, dashed=".* maxSlowdown$")


def dashboard() -> dict[str, Any]:
    return {
        "description": "ThrottledJob: peaks vs targets, levers, slowdown. Generated by "
                       "tools/dashboard.py; do not edit by hand.",
        "uid": UID,
        "title": "ThrottledJob",
        "tags": ["throttledjob", "kubernetes", "gpu"],
        "editable": True,
        "graphTooltip": 1,
        "refresh": "30s",
        "schemaVersion": 39,
        "version": 1,
        "time": {"from": "now-1h", "to": "now"},
        "timezone": "",
        "links": [],
        "annotations": {"list": [
            {"builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"},
             "enable": True, "hide": True, "iconColor": "rgba(0, 211, 255, 1)",
             "name": "Annotations & Alerts", "type": "dashboard"},
            {"name": "Throttling", "datasource": DS, "enable": True,
             "iconColor": "orange",
             "expr": f"max by ({BY}) (throttledjob_throttling{{{SEL}}}) == 1",
             "step": "15s", "titleFormat": "Throttling {{pod}}",
             "textFormat": "{{namespace}}/{{throttledjob}}: a controller holds the "
                           "workload back",
             "useValueForTime": False},
        ]},
        "templating": {"list": variables()},
        "panels": panels(),
    }


def render() -> str:
    return json.dumps(dashboard(), indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="fail if a written copy differs from this source")
    args = parser.parse_args(argv)
    text = render()
    stale = [p for p in OUTPUTS if not p.exists() or p.read_text() != text]
    if args.check:
        for p in stale:
            print(f"{p.relative_to(ROOT)} is stale: run python tools/dashboard.py",
                  file=sys.stderr)
        return 1 if stale else 0
    for p in OUTPUTS:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
