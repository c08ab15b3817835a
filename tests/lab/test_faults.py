"""Faults injected on a lab host (``llmfleet.lab.faults``): every one ends with the host serving the
old or the new release, nothing lost, and the next deploy converging. ``bench/fault_report.py`` runs
the same scenarios and prints the table with the times. The controller-loss faults (each waits out the
host's revert timer) are in test_faults_cuts.py, so that pytest-xdist runs the two files side by side.

Every deploy here carries an API key; the secrets scan runs last and looks for it in everything the
suite left behind (host files, journal, Docker log, argv; local output, audit, diffs, SSH commands).
"""

from __future__ import annotations

import pytest

from llmfleet.lab import faults as F

pytestmark = pytest.mark.lab

HOST = "gpu-v100-01"


@pytest.fixture(scope="module")
def bench(lab, tmp_path_factory):
    lab.ensure_hosts(HOST)
    F.prepare_inventory(lab.inventory_path, HOST)
    tmp = tmp_path_factory.mktemp("faults")
    config = dict(lab.config, audit_log=str(tmp / "audit.jsonl"))
    b = F.FaultBench(lab.inventory_path, HOST, lab.container(HOST), config)
    b.local_audit = tmp / "audit.jsonl"
    return b


def status_health(bench: F.FaultBench, service: str = F.SERVICE):
    """The service's health as ``invoke status`` shows it (over SSH, the inventory's settings)."""
    from llmfleet.fleet import status as S
    from llmfleet.inventory.ansible import load_inventory

    host = load_inventory(bench.inventory_path).hosts[bench.host]

    def health() -> str:
        for st, settings in S.query_hosts([host], config=bench.config, timeout=20, metrics=False):
            for row in S.host_rows(st, settings):
                if row.service == service:
                    return row.health
        return "?"

    return health


def _check(r: F.FaultResult) -> None:
    assert r.serving, f"{r.fault}: nothing serves afterwards ({r.outcome}; {r.detail})"
    assert r.data_lost == "none", f"{r.fault}: {r.data_lost}"
    assert r.converged, f"{r.fault}: the next deploy did not converge"
    assert r.ok, f"{r.fault}: {r.outcome}; {r.detail}"


def test_sshd_restarted_mid_deploy(bench):
    _check(bench.sshd_restarted())


def test_dockerd_restarted_mid_deploy(bench):
    _check(bench.dockerd_restarted())


def test_hung_engine_is_restarted_by_the_host_alone(bench):
    r = bench.hung_engine()
    _check(r)
    assert r.outcome.startswith("watchdog restarted"), r.outcome


def test_engine_loop_frozen_with_health_still_200_is_judged_hung_and_restarted(bench):
    """llama-server's slots stop advancing (its main loop held) while /health answers 200."""
    r = bench.frozen_engine_loop(health=status_health(bench))
    _check(r)
    assert r.extra["health_while_frozen"], "the fault must leave /health answering"
    assert r.extra["restarted_after_s"] is not None, r.extra
    assert r.outcome.startswith("watchdog restarted: 2 failed judgements in a row; last: "), r.outcome
    assert ("/metrics did not within" in r.outcome or "1-token completion did not finish" in r.outcome), r.outcome
    assert "hung" in r.extra["health_seen"], r.extra


def test_engine_crash_loop_after_a_healthy_deploy_stops_at_the_start_limit(bench):
    r = bench.crash_loop_after_deploy()
    _check(r)
    assert r.extra["status"]["unit_restarts"] >= 1
    assert r.extra["status"]["last_watchdog_action"]["result"] == "start-limit"


def test_two_controllers_exactly_one_proceeds(bench):
    r = bench.two_controllers()
    _check(r)
    assert r.extra["results"] == ["deployed", "refused"]


def test_registry_unreachable_changes_nothing(bench):
    _check(bench.registry_unreachable())


def test_unknown_digest_changes_nothing(bench):
    _check(bench.unknown_digest())


def test_port_taken_by_a_stranger_is_refused(bench):
    _check(bench.port_taken())


def test_disk_full_during_upload_switches_nothing(bench):
    r = bench.disk_full()
    _check(r)
    assert "No space left on device" in r.extra["reason"] and "nothing was switched" in r.extra["reason"]
    assert r.extra["left_tmp"] == "0"  # no half-written release folder holds the space


def test_missing_model_file_is_refused(bench):
    _check(bench.model_missing())


def test_truncated_model_file_goes_back(bench):
    _check(bench.model_truncated())


def test_engine_crash_loop_goes_back(bench):
    _check(bench.crash_loop())


def test_hostile_values_run_nothing(bench):
    _check(bench.hostile_values())


def test_hostile_inventory_values_are_refused_before_any_connection(bench):
    r = bench.hostile_inventory()
    _check(r)
    assert all(c["refused"] and c["one_line"] and c["names_file_and_field"] for c in r.extra["cases"])


def test_the_api_key_is_nowhere_but_the_0600_env_file_after_the_whole_suite(bench):
    """Last in this file: it scans what every fault above left behind."""
    r = bench.secrets_scan([bench.local_audit])
    assert r.extra["found"] == [], r.detail
    _check(r)
