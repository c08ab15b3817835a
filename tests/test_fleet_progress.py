"""Large fleets stay readable: one progress line per batch, not one line per host event."""

from __future__ import annotations

from llmfleet.fleet.progress import LiveLine, Tally


def test_tally_text_counts_done_failed_running_waiting():
    t = Tally(batch=2, batches=3, hosts=10, started=100.0, running=4, done=5, failed=1,
              results={"deployed": 4, "failed": 1})
    assert t.text(112.4) == "batch 2/3: 5/10 done (4 deployed, 1 failed), 1 failed, 4 running, 1 waiting [12s]"


def _run(line: LiveLine, now: list[float], hosts: int) -> None:
    line.begin(1, 1, hosts)
    for i in range(hosts):
        now[0] += 0.05
        line.host_started()
        now[0] += 0.05
        line.host_done("failed" if i % 100 == 0 else "check", failed=i % 100 == 0)
    line.end()


def test_in_a_log_1000_hosts_make_a_handful_of_lines_and_the_last_has_the_totals():
    out: list[str] = []
    now = [0.0]
    _run(LiveLine(out.append, terminal=False, every_s=10, clock=lambda: now[0]), now, 1000)
    assert out[0] == "batch 1/1: 0/1000 done, 0 failed, 0 running, 1000 waiting [0s]\n"
    assert out[-1] == "batch 1/1: 1000/1000 done (990 check, 10 failed), 10 failed, 0 running, 0 waiting [100s]\n"
    assert 10 <= len(out) <= 13  # a line every 10 s of a 100 s batch, plus the first and the last


def test_on_a_terminal_the_line_is_rewritten_in_place_and_ends_with_a_newline():
    out: list[str] = []
    now = [0.0]
    _run(LiveLine(out.append, terminal=True, min_interval_s=0.2, clock=lambda: now[0]), now, 50)
    assert all(s.startswith("\r\x1b[2K") for s in out)
    assert sum(s.endswith("\n") for s in out) == 1 and out[-1].endswith("\n")
    assert len(out) <= 30  # at most five a second over 5 s, not one per host event (100)


def test_an_upgrade_reports_each_batch_on_the_line_and_each_host_as_it_finishes():
    from llmfleet.fleet.upgrade import run_upgrade
    from tests.test_upgrade import HOSTS, FakeFleet

    out: list[str] = []
    finished: list[tuple[str, str]] = []
    line = LiveLine(out.append, terminal=False, every_s=3600)
    fleet = FakeFleet(fail=["h3"])
    run_upgrade(HOSTS, deploy=fleet.deploy, serial=[1, "100%"], max_fail_percentage=50, forks=3, progress=line,
                on_host=lambda r: finished.append((r.host, r.result)))
    assert sorted(finished) == sorted((h, "rolled_back" if h == "h3" else "deployed") for h in HOSTS)
    assert out[0].startswith("batch 1/2: 0/1 done, 0 failed, 0 running, 1 waiting")
    assert out[1].startswith("batch 1/2: 1/1 done (1 deployed), 0 failed, 0 running, 0 waiting")
    assert out[-1].startswith("batch 2/2: 7/7 done (6 deployed, 1 rolled_back), 1 failed, 0 running, 0 waiting")
