"""Faults injected on a lab host (``llmfleet.lab.faults``): every one ends with the host serving the
old or the new release, nothing lost, and the next deploy converging. ``bench/fault_report.py`` runs
the same scenarios and prints the table with the times.

The most valuable first: a controller killed during the health check (the host timer reverts), a
hung engine (the host watchdog restarts it), two controllers at once, an image that cannot be
pulled, a digest the registry lacks, a port taken by a stranger, and a scan for the API key.
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


def _check(r: F.FaultResult) -> None:
    assert r.serving, f"{r.fault}: nothing serves afterwards ({r.outcome}; {r.detail})"
    assert r.data_lost == "none", f"{r.fault}: {r.data_lost}"
    assert r.converged, f"{r.fault}: the next deploy did not converge"
    assert r.ok, f"{r.fault}: {r.outcome}; {r.detail}"


def test_controller_killed_mid_health_check_is_reverted_by_the_host_timer(bench):
    r = bench.controller_killed_mid_health()
    _check(r)
    assert r.outcome.startswith("reverted: reverted by host timer"), r.outcome
    # back on the previous release within the revert timeout, plus stopping the new engine (the lab's
    # broken image ignores SIGTERM: the unit's 30 s stop timeout) and loading the old one
    assert r.time_to_serving_s is not None
    assert r.time_to_serving_s <= F.CONFIRM_TIMEOUT_S + 30 + 30  # stop timeout; load and a busy lab


def test_hung_engine_is_restarted_by_the_host_alone(bench):
    r = bench.hung_engine()
    _check(r)
    assert r.outcome.startswith("watchdog restarted"), r.outcome


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


def test_the_api_key_is_nowhere_but_the_0600_env_file(bench):
    r = bench.secrets_scan([bench.local_audit])
    assert r.extra["found"] == [], r.detail
    _check(r)


def test_missing_model_file_is_refused(bench):
    _check(bench.model_missing())


def test_truncated_model_file_goes_back(bench):
    _check(bench.model_truncated())


def test_engine_crash_loop_goes_back(bench):
    _check(bench.crash_loop())


def test_hostile_values_run_nothing(bench):
    _check(bench.hostile_values())
