"""Losing the controller (``llmfleet.lab.faults``): the controller killed during the health check, and
the SSH connection cut (controller killed and the port dropped) at each step of a deploy. Each ends with
the host serving the old or the new release within the commit-confirmed revert timeout, nothing lost,
and the next deploy converging; then the API key is looked for in everything these deploys left.

A file of its own (the rest is in test_faults.py): each case waits out the host timer, about a minute.
"""

from __future__ import annotations

import pytest

from llmfleet.lab import faults as F
from tests.lab.test_faults import _check, bench  # noqa: F401 - the fixture, used by name

pytestmark = pytest.mark.lab


def test_controller_killed_mid_health_check_is_reverted_by_the_host_timer(bench):  # noqa: F811
    r = bench.controller_killed_mid_health()
    _check(r)
    assert r.outcome.startswith("reverted: reverted by host timer"), r.outcome
    # back on the previous release within the revert timeout, plus stopping the new engine (the lab's
    # broken image ignores SIGTERM: the unit's 30 s stop timeout) and loading the old one
    assert r.time_to_serving_s is not None
    assert r.time_to_serving_s <= F.CONFIRM_TIMEOUT_S + 30 + 30  # stop timeout; load and a busy lab


@pytest.mark.parametrize("step", list(F.CUT_STEPS))
def test_ssh_cut_at_each_step_ends_on_the_old_or_new_release(bench, step):  # noqa: F811
    r = bench.ssh_cut(step)
    _check(r)
    expect = F.CUT_STEPS[step][1]
    assert "expected" in r.extra, f"{r.outcome}: {r.detail}"  # the deploy never reached the step: why
    assert r.extra["expected"] == expect
    if expect == "old" and step not in F.NO_RESTART_STEPS:
        assert r.outcome == "host timer: reverted", r.outcome
    # the revert timeout from the arm, the restart of the old engine, a busy lab
    assert r.extra["settled_s"] is not None and r.extra["settled_s"] <= F.CONFIRM_TIMEOUT_S + 60


def test_a_failure_after_a_deploy_killed_after_its_switch_goes_back_to_the_last_confirmed_release(bench):  # noqa: F811
    """Release B switched to by a deploy killed at once (current, never confirmed, its host timer
    pending); the next deploy (C, an engine that crashes) arms its revert to and goes back to A, the
    release last confirmed healthy, not to B; B stays unconfirmed and is listed so."""
    from llmfleet.fleet import status

    r = bench.killed_after_switch_then_failed()
    _check(r)
    b = r.extra["unconfirmed"]
    assert r.extra["unconfirmed_health"] is None and r.extra["unconfirmed_after"] is None  # never marked
    assert r.serving == r.extra["went_back_to"] != b
    assert r.extra["armed"] and all(f"host reverts to {r.serving} " in ln for ln in r.extra["armed"]), r.extra
    assert not r.extra["timer_reverts"]  # the next deploy's arm replaced the killed one's timer
    rows = {row.release: row for row in status.release_rows(bench.host, {F.SERVICE: bench.state()})}
    assert rows[b].health == "unconfirmed" and not rows[b].confirmed and not rows[b].go_back
    assert rows[r.serving].go_back and rows[r.serving].confirmed


def test_the_api_key_is_nowhere_but_the_0600_env_file_after_the_cuts(bench):  # noqa: F811
    """Last in this file: it scans what every cut deploy above left behind."""
    r = bench.secrets_scan([bench.local_audit])
    assert r.extra["found"] == [], r.detail
    _check(r)
