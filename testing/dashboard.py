"""The Grafana dashboard's queries, with the variables filled in as Grafana fills them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from testing.paths import ROOT

CHART_COPY = ROOT / "charts" / "throttledjob" / "dashboards" / "throttledjob.json"
STANDALONE = ROOT / "docs" / "grafana-dashboard.json"

SCRAPE_SECONDS = 1
# Grafana: $__rate_interval = max($__interval + scrape interval, 4 x scrape interval).
RATE_INTERVAL = f"{4 * SCRAPE_SECONDS}s"


def load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def queries(dash: dict[str, Any]) -> list[tuple[str, str]]:
    """(where, PromQL) of every panel target and annotation."""
    out = [(f"panel {p['title']!r} {t['refId']}", t["expr"])
           for p in dash["panels"] for t in p.get("targets", [])]
    out += [(f"annotation {a['name']!r}", a["expr"])
            for a in dash["annotations"]["list"] if "expr" in a]
    return out


def fill(expr: str, values: dict[str, str]) -> str:
    """Substitute variables as Grafana does ($name and ${name}); none may be left."""
    out = expr.replace("$__rate_interval", RATE_INTERVAL)
    for name, value in values.items():
        out = out.replace("${" + name + "}", value).replace("$" + name, value)
    assert "$" not in out, f"unfilled variable in {out}"
    return out
