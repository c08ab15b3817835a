"""Bench pictures (plot data, the SVG/HTML writer, the PNG writer), the upgrade gate's wrapper with
fake deploy/bench/rollback, and the bench task's usage errors (nothing contacted)."""

from __future__ import annotations

import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from types import SimpleNamespace

import pytest

from llmfleet.errors import UsageError
from llmfleet.fleet import bench as B
from llmfleet.fleet import bench_gate, plot
from tests.test_bench import doc_with, lv

REPO = Path(__file__).resolve().parents[1]
A = "20261201T050000Z-aaaaaaaaaa"
Bid = "20261201T060000Z-bbbbbbbbbb"


def two_releases():
    a = doc_with([lv(1, 40.0, 40.0, 0.20), lv(2, 38.0, 75.0, 0.25), lv(4, 30.0, 110.0, 0.40)], release=A)
    b = doc_with([lv(1, 20.0, 20.0, 0.30), lv(2, 19.0, 37.0, 0.35), lv(4, 15.0, 55.0, 0.60)], release=Bid)
    return a, b


def test_plot_data_one_series_per_release_and_prompt():
    a, b = two_releases()
    s = plot.plot_data([a, b])
    assert [x.label for x in s] == [A, Bid]
    assert [p.concurrency for p in s[0].points] == [1, 2, 4]
    assert s[0].points[2].aggregate_tokps == 110.0 and s[1].points[0].ttft_ms == pytest.approx(300.0)
    c = doc_with([lv(1, 40.0, 40.0, p=128), lv(1, 35.0, 35.0, p=2048)], release=A)
    assert [x.label for x in plot.plot_data([c])] == [f"{A} · prompt 128", f"{A} · prompt 2048"]


@pytest.mark.parametrize("v, top", [(0, 1.0), (0.7, 1.0), (1.0, 1.0), (1.2, 2.0), (23, 25.0), (110, 200.0),
                                    (260, 500.0), (4999, 5000.0)])
def test_axis_ends(v, top):
    assert plot.nice_max(v) == top


def test_scene_places_higher_values_higher():
    a, b = two_releases()
    sc = plot.scene(plot.plot_data([a, b]), "t")
    lines = [s for s in sc.shapes if s.kind == "polyline" and not s.dash]
    # first panel, aggregate: release A's line lies above B's at every concurrency (smaller y)
    la, lb = lines[0], lines[1]
    assert all(ya < yb for (_, ya), (_, yb) in zip(la.points, lb.points, strict=True))
    assert all(0 <= x <= sc.width and 0 <= y <= sc.height for s in sc.shapes for x, y in s.points)


def test_svg_and_html_are_self_contained_and_carry_the_numbers(tmp_path):
    a, b = two_releases()
    b["notes"] = ["<script>alert(1)</script> & more"]
    path = plot.write(tmp_path / "bench.html", [a, b], "h1/s: A vs B")
    text = path.read_text()
    assert "<svg" in text and "<script" not in text and "&lt;script&gt;" in text
    assert not re.search(r"(src|href)=\"(http|//)", text)  # nothing fetched from elsewhere
    assert "110.0" in text and A in text and Bid in text
    svg = plot.write(tmp_path / "bench.svg", [a, b], "t").read_text()
    ET.fromstring(svg)  # well-formed XML
    assert svg.count("<polyline") == 2 * 3  # per release: aggregate, per-stream, TTFT


def test_png_is_drawn(tmp_path):
    pytest.importorskip("PIL")
    from PIL import Image

    a, b = two_releases()
    path = plot.write(tmp_path / "bench.png", [a, b], "t")
    img = Image.open(path)
    assert img.format == "PNG" and img.size == (plot.WIDTH, plot.HEIGHT)
    colours = {c for _, c in img.getcolors(1 << 20)}
    assert (0x1F, 0x77, 0xB4) in colours and (0xD6, 0x27, 0x28) in colours  # both releases' lines


@pytest.mark.parametrize("name, words", [("x.jpg", "ending in .png, .html or .svg"), ("nope/x.html", "does not exist")])
def test_plot_refuses_bad_files(tmp_path, name, words):
    a, _ = two_releases()
    with pytest.raises(UsageError, match=words):
        plot.write(tmp_path / name, [a], "t")


def test_plot_refuses_nothing_to_draw(tmp_path):
    with pytest.raises(UsageError, match="no measured level"):
        plot.write(tmp_path / "x.html", [doc_with([])], "t")


# ---------------------------------------------------------------------------------------------
# the gate around a host's deploy


class Calls:
    def __init__(self, before, after, deploy_result="deployed", rollback_result="rolled_back"):
        self.before, self.after = before, after
        self.deploy_result, self.rollback_result = deploy_result, rollback_result
        self.log: list[str] = []
        self.deployed = False

    def measure(self, inv, host, service, **kw):
        self.log.append(f"bench {host}/{service}")
        doc = self.after if self.deployed else self.before
        return (doc, "") if doc is not None else (None, "health check failed")

    def deploy(self, host):
        self.deployed = True
        self.log.append(f"deploy {host}")
        return SimpleNamespace(result=self.deploy_result, releases={"tiny": Bid}, reason="")

    def rollback(self, inv, host, *, service, to, config, options, log):
        self.log.append(f"rollback {host}/{service} to {to}")
        return SimpleNamespace(result=self.rollback_result, reason="engine refused")


@pytest.fixture
def inv():
    host = SimpleNamespace(name="n1", vars={}, sources={})
    return SimpleNamespace(hosts={"n1": host})


def gate(monkeypatch, calls, inv, pct=20):
    monkeypatch.setattr(bench_gate, "_measure", calls.measure)
    return bench_gate.gated(calls.deploy, inv, pct=pct, config={}, options=SimpleNamespace(who="me"),
                            services={"n1": ["tiny"]}, log=calls.log.append, rollback=calls.rollback)


def test_gate_rolls_back_a_slower_canary(monkeypatch, inv):
    calls = Calls(doc_with([lv(1, 40.0)], release=A), doc_with([lv(1, 20.0)], release=Bid))
    out = gate(monkeypatch, calls, inv)("n1")
    assert out.result == "rolled_back" and out.releases == {"tiny": A}
    assert "50% slower" in out.reason and f"back on release {A}" in out.reason
    steps = [x for x in calls.log if not x.startswith("n1:")]
    assert steps == ["bench n1/tiny", "deploy n1", "bench n1/tiny", f"rollback n1/tiny to {A}"]


def test_gate_lets_an_equal_release_through(monkeypatch, inv):
    calls = Calls(doc_with([lv(1, 40.0)], release=A), doc_with([lv(1, 37.0)], release=Bid))
    out = gate(monkeypatch, calls, inv)("n1")
    assert out.result == "deployed" and not any(x.startswith("rollback") for x in calls.log)


def test_gate_failed_rollback_is_a_failed_host(monkeypatch, inv):
    calls = Calls(doc_with([lv(1, 40.0)], release=A), None, rollback_result="failed")
    out = gate(monkeypatch, calls, inv)("n1")
    assert out.result == "failed" and "could not be benchmarked" in out.reason and "ROLLBACK" in out.reason


def test_gate_leaves_a_failed_deploy_and_a_first_deploy_alone(monkeypatch, inv):
    calls = Calls(doc_with([lv(1, 40.0)], release=A), None, deploy_result="rolled_back")
    assert gate(monkeypatch, calls, inv)("n1").result == "rolled_back"
    assert calls.log.count("bench n1/tiny") == 1  # no bench after a deploy that did not stay
    calls = Calls(None, doc_with([lv(1, 1.0)], release=Bid))
    assert gate(monkeypatch, calls, inv)("n1").result == "deployed"
    assert any("no baseline" in x for x in calls.log)


def test_gate_percentage_checked_before_any_host(monkeypatch, inv):
    calls = Calls(None, None)
    with pytest.raises(ValueError):
        gate(monkeypatch, calls, inv, pct=101)
    assert calls.log == []


# ---------------------------------------------------------------------------------------------
# the task's usage errors: exit 2, one line, nothing contacted


@pytest.mark.parametrize("args, words", [
    (["bench"], "choose the host with --host"),
    (["bench", "--host", "nosuch"], "no host 'nosuch'"),
    (["bench", "--host", "gpu-v100-01", "--concurrency", "0"], "--concurrency: 0 is out of range"),
    (["bench", "--host", "gpu-v100-01", "--plot", "x.gif"], "ending in .png, .html or .svg"),
    (["bench", "--host", "gpu-v100-01", "--compare", "a,b"], "not a release id"),
    (["bench", "--host", "gpu-v100-01", "--compare", A], "give two release ids"),
    (["upgrade", "--group", "lab_fleet", "--bench-gate", "150"], "--bench-gate: '150' is out of range"),
    (["upgrade", "--group", "lab_fleet", "--bench-gate", "x"], "--bench-gate"),
])
def test_usage_errors(args, words):
    res = subprocess.run([sys.executable, "-m", "invoke", *args], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert res.returncode == 2, res.stderr
    assert words in res.stderr and "Traceback" not in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


def test_upgrade_help_lists_the_bench_gate():
    res = subprocess.run([sys.executable, "-m", "invoke", "--help", "upgrade"], cwd=REPO, capture_output=True,
                         text=True, timeout=60)
    assert "--bench-gate" in res.stdout


def test_gate_params_are_bounded():
    assert B.GateVerdict  # the gate's own load: one stream, a few requests, each with a time limit
    p = bench_gate.GATE_PARAMS
    assert p.concurrency == (1,) and p.requests and p.requests <= 10 and p.request_timeout_s <= 300
