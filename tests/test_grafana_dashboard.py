"""The packaged Grafana dashboard (src/llmfleet/monitoring/llmfleet-dashboard.json): its structure against the
schema of the fields Grafana's file provisioning needs (tests/data/grafana_dashboard.schema.json), unique panel
ids, panels that do not overlap, every query naming only series the rules or the engines give, and every
PromQL expression parsed by promtool (offline: the expressions as recording rules, `promtool check rules`)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import jsonschema
import pytest
import yaml

from llmfleet.monitoring import packaged

DASHBOARD = packaged("llmfleet-dashboard.json")
SCHEMA = Path(__file__).parent / "data" / "grafana_dashboard.schema.json"
PROMTOOL = shutil.which("promtool")


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def exprs(d: dict) -> list[str]:
    out = [t["expr"] for p in d["panels"] for t in p["targets"]]
    out += [a["expr"] for a in d.get("annotations", {}).get("list", []) if "expr" in a]
    for v in d["templating"]["list"]:
        if v["type"] == "query":  # Grafana's label_values(SELECTOR, LABEL): the selector is PromQL
            m = re.fullmatch(r"label_values\((.+),\s*([a-z_]+)\)", v["query"]["query"])
            assert m, v["query"]["query"]
            out.append(m.group(1))
    return out


def test_the_dashboard_has_the_fields_grafana_needs():
    jsonschema.validate(dashboard(), json.loads(SCHEMA.read_text()))


@pytest.mark.parametrize(("change", "message"), [
    (lambda d: d["panels"][0].pop("gridPos"), "gridPos"),
    (lambda d: d["panels"][1]["targets"][0].update(datasource={"type": "prometheus", "uid": "my-prom"}), "my-prom"),
    (lambda d: d["templating"].update(list=[]), "contain"),
])
def test_the_schema_refuses_a_broken_dashboard(change, message):
    d = dashboard()
    change(d)
    with pytest.raises(jsonschema.ValidationError, match=message):
        jsonschema.validate(d, json.loads(SCHEMA.read_text()))


def test_panel_ids_are_unique_and_panels_do_not_overlap():
    panels = dashboard()["panels"]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    cells = set()
    for p in panels:
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24, p["title"]
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not cells & mine, f"{p['title']} overlaps another panel"
        cells |= mine


def test_the_dashboard_shows_what_operators_ask_for():
    text = json.dumps(dashboard())
    for series in ("llmfleet:decode_tokps", "llmfleet:decode_floor_tokps", "llmfleet:ttft_seconds:p90",
                   "llmfleet:requests_waiting", "llmfleet:kv_cache_usage", "process_start_time_seconds", "release"):
        assert series in text, series


def test_every_recorded_series_the_dashboard_reads_is_recorded_by_the_rules():
    rules = yaml.safe_load(packaged("rules.yml").read_text())
    recorded = {r["record"] for g in rules["groups"] for r in g["rules"] if "record" in r}
    recorded.add("llmfleet:decode_floor_tokps")  # the host rules `invoke prometheus.targets` writes
    used = {m for e in exprs(dashboard()) for m in re.findall(r"llmfleet:[a-z0-9_:]+", e)}
    assert used and used <= recorded, used - recorded


@pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (scripts/bootstrap.sh installs it)")
def test_every_promql_expression_parses(tmp_path):
    # Grafana's variables become what they stand for: a regex matching all, a range
    def concrete(e: str) -> str:
        return e.replace("$__rate_interval", "5m").replace("$host", ".*").replace("$group", ".*")

    found = exprs(dashboard())
    assert len(found) >= 10
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:expr_{i}", "expr": concrete(e)} for i, e in enumerate(found)]}]}
    p = tmp_path / "dashboard-exprs.yml"
    p.write_text(json.dumps(rules))
    res = subprocess.run([PROMTOOL, "check", "rules", str(p)], capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    # and promtool does refuse a broken one (the check is not vacuous)
    rules["groups"][0]["rules"].append({"record": "dashboard:broken", "expr": "sum by (host (up)"})
    p.write_text(json.dumps(rules))
    res = subprocess.run([PROMTOOL, "check", "rules", str(p)], capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode != 0
