"""``invoke speed``, ``invoke status`` keeping what it read, and ``invoke plan`` showing the fleet's
figures: the tasks as a user runs them, against a real sshd on loopback (one host with releases, a
health report and a bench result; one host that is down), each with a cache folder of its own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from llmfleet.health import speed_cache, speed_overlay
from llmfleet.health import speed_history as sh
from llmfleet.inventory.ansible import Host
from tests.test_speed_history import R1, R2, bench_doc, healthy, level, manifest
from tests.test_status import _free_port

REPO = Path(__file__).resolve().parents[1]


def make_root(root: Path) -> None:
    rels = root / "services" / "chat" / "releases"
    for rid, health in ((R1, healthy(118.4)), (R2, {"result": "unhealthy", "decode_tokps": 12.0})):
        d = rels / rid
        d.mkdir(parents=True)
        (d / "manifest.json").write_text(json.dumps(manifest(rid)) + "\n")
        (d / "health.json").write_text(json.dumps(health) + "\n")
    (rels / R1 / "bench.json").write_text(json.dumps(bench_doc([level(1, 128, 112.0), level(4, 128, 80.0)])) + "\n")
    (root / "services" / "chat" / "current").symlink_to(f"releases/{R1}")


@pytest.fixture
def fleet(sshd, tmp_path):
    root = tmp_path / "root"
    make_root(root)
    login = {"ansible_host": "127.0.0.1", "ansible_user": "root", "ansible_ssh_private_key_file": str(sshd.client_key)}
    services = [{"name": "chat", "engine": "llamacpp", "model": "tiny", "model_path": "/srv/models/tiny",
                 "image": "llamacpp:x", "port": _free_port()}]
    up = Host("up", vars={**login, "ansible_port": sshd.port, "llmfleet_root": str(root), "llmfleet_services": services,
                          "llmfleet_gpu": "v100-sxm2-32gb"})
    down = Host("down", vars={**login, "ansible_port": _free_port(), "llmfleet_services": services})
    kh = tmp_path / "known_hosts"
    kh.write_text(f"[127.0.0.1]:{sshd.port} " + " ".join(sshd.host_pub.read_text().split()[:2]) + "\n")
    inv = tmp_path / "inv"
    inv.mkdir()
    (inv / "hosts.yml").write_text(yaml.safe_dump({"fleet": {"hosts": {"up": dict(up.vars), "down": dict(down.vars)}}}))
    return {"inv": inv, "known_hosts": kh, "tmp": tmp_path, "cache": tmp_path / "cache"}


def run(fleet, *args, env=None):
    e = dict(os.environ, INVOKE_LLMFLEET_SSH_KNOWN_HOSTS=str(fleet["known_hosts"]), XDG_CACHE_HOME=str(fleet["cache"]),
             INVOKE_LLMFLEET_AUDIT_LOG=str(fleet["tmp"] / "audit.jsonl"), COLUMNS="250", **(env or {}))
    return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=120, env=e)


def test_speed_reads_the_hosts_keeps_what_it_read_and_writes_an_overlay(fleet, monkeypatch):
    res = run(fleet, "speed", "-i", str(fleet["inv"]), "--host", "up", "--json")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    (row,) = doc["classes"]
    assert (row["card"], row["engine"], row["model"], row["quant"], row["context"]) == (
        "v100-sxm2-32gb", "llamacpp", "qwen2.5-7b-instruct", "q4_k_m", "<=16k")
    # one healthy run (R1, by its health check); R2 failed its check and does not count
    assert row["measured"] == {"count": 1, "min": 118.4, "max": 118.4, "median": 118.4, "hosts": ["up"]}
    assert row["predicted"] == [90.0, 150.0] and row["verdict"] == "within"
    assert row["median_vs_ceiling"] == 0.592  # 118.4 of a 200 tok/s ceiling
    assert row["efficiency"]["planner"] and row["efficiency"]["fitted"]
    assert doc["hosts_read"] == ["up"] and doc["unreachable"] == []
    # the bench result was read too, and kept
    monkeypatch.setenv("XDG_CACHE_HOME", str(fleet["cache"]))
    assert sorted((r.release, r.source, r.healthy) for r in speed_cache.load()) == [
        (R1, "bench", True), (R1, "health", True), (R2, "health", False)]

    # without hosts: from what this machine kept; the table names where the figures came from
    res = run(fleet, "speed")
    assert res.returncode == 0, res.stderr
    assert "118" in res.stdout and "within" in res.stdout and "kept on this machine: up (read " in res.stdout

    out = fleet["tmp"] / "overlay.yaml"
    res = run(fleet, "speed", "--write", str(out))
    assert res.returncode == 0, res.stderr
    entries, problems = speed_overlay.parse_overlay(out.read_text())
    assert problems == [] and entries[0].median == 118.4
    assert entries[0].source.startswith("measured on up at 2026-11-01T10:05:00")


def test_an_unreachable_host_keeps_its_cached_records_and_fails_the_run(fleet):
    assert run(fleet, "speed", "-i", str(fleet["inv"]), "--host", "up").returncode == 0
    res = run(fleet, "speed", "-i", str(fleet["inv"]), "--group", "fleet", "--timeout", "5", "--json")
    assert res.returncode == 1
    assert res.stderr.strip().splitlines()[-1].startswith("error: 1 of 2 host(s) unreachable: down")
    doc = json.loads(res.stdout)
    assert doc["unreachable"][0]["host"] == "down" and doc["classes"][0]["measured"]["count"] == 1


@pytest.mark.parametrize(("args", "names"), [
    (["--write", "/nonexistent-folder/overlay.yaml"], "--write"),
    (["--forks", "0"], "--forks"),
])
def test_speed_usage_errors_are_one_line_and_exit_2(fleet, args, names):
    res = run(fleet, "speed", *args)
    assert res.returncode == 2
    (line,) = res.stderr.strip().splitlines()
    assert line.startswith("error:") and names in line


def test_writing_an_overlay_with_nothing_measured_fails_and_writes_nothing(fleet):
    out = fleet["tmp"] / "overlay.yaml"
    res = run(fleet, "speed", "--write", str(out))
    assert res.returncode == 1 and "no healthy measurement" in res.stderr and not out.exists()


def test_status_keeps_the_health_records_it_read(fleet, monkeypatch):
    res = run(fleet, "status", "-i", str(fleet["inv"]), "--host", "up", "--no-metrics")
    assert res.returncode == 0, res.stderr
    monkeypatch.setenv("XDG_CACHE_HOME", str(fleet["cache"]))
    assert sorted((r.host, r.release, r.tokps) for r in speed_cache.load()) == [("up", R1, 118.4), ("up", R2, 12.0)]


def test_plan_shows_the_fleets_figures_beside_its_prediction(fleet, monkeypatch):
    args = ["plan", "--model", "qwen2.5-7b-instruct", "--quant", "q4_k_m", "--gpu", "v100-sxm2-32gb", "--context", "8k"]
    res = run(fleet, *args, "--json")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["fleet_measured"] is None
    key = sh.key_for(doc, doc["image"])
    monkeypatch.setenv("XDG_CACHE_HOME", str(fleet["cache"]))
    speed_cache.remember({h: [sh.SpeedRecord(key=key, host=h, service="chat", release=R1, time="", tokps=t,
                                             source="health", healthy=True, ceiling=doc["decode_tokps_ceiling"],
                                             predicted=tuple(doc["decode_tokps_realistic"]))]
                          for h, t in (("gpu-v100-01", 117.0), ("gpu-v100-02", 121.0), ("gpu-v100-03", 119.0))})
    res = run(fleet, *args, "--json")
    fm = json.loads(res.stdout)["fleet_measured"]
    assert fm["line"] == "measured on 3 hosts: 117-121 tok/s (median 119)"
    assert (fm["runs"], fm["min"], fm["max"], fm["median"]) == (3, 117.0, 121.0, 119.0)
    res = run(fleet, *args)
    assert "measured on 3 hosts: 117-121 tok/s (median 119)" in res.stdout
    # a configured overlay is shown too; one that cannot be read is a warning, not the plan's failure
    out = fleet["tmp"] / "overlay.yaml"
    assert run(fleet, "speed", "--write", str(out)).returncode == 0
    res = run(fleet, *args, env={"INVOKE_LLMFLEET_SPEED_OVERLAY": str(out)})
    assert res.returncode == 0 and "speed overlay" in res.stdout and "measured on gpu-v100-01" in res.stdout
    # ... and the plan is made again with the efficiency the fleet measured: its realistic range now
    # holds the measured median, and it says where the efficiency came from
    res = run(fleet, *args, "--json", env={"INVOKE_LLMFLEET_SPEED_OVERLAY": str(out)})
    calibrated = json.loads(res.stdout)
    lo, hi = calibrated["decode_tokps_realistic"]
    assert lo <= 119.0 <= hi * 1.02, (lo, hi)
    assert (lo, hi) != tuple(doc["decode_tokps_realistic"])
    assert "fitted to this fleet's measurements" in calibrated["efficiency_assumption"]
    assert "measured on gpu-v100-01" in calibrated["efficiency_assumption"]
    res = run(fleet, *args, env={"INVOKE_LLMFLEET_SPEED_OVERLAY": str(fleet["tmp"] / "missing.yaml")})
    assert res.returncode == 0 and "warning" in res.stderr and "missing.yaml" in res.stderr
