"""The committed simulated-fleet recording still answers every command the controller sends today.

bench/fleet_scale_bench.py replays bench/data/simfleet-lab-node.json (a real lab host's answers, matched on
the exact command text and stdin) to a fleet of simulated hosts; when a remote script changes, the recording
no longer holds its text and every simulated host fails. Here the controller runs each command the bench
measures (and ``facts``) against one simulated host, in this process, over loopback SSH (no Docker, no lab),
and every command it sends must have a recorded answer, and each run must end as it did on the lab host.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import subprocess
from pathlib import Path

import pytest

from llmfleet.lab import simfleet
from llmfleet.lab.simfleet import Recording, SimFleet

ROOT = Path(__file__).resolve().parents[1]


def _bench():
    spec = importlib.util.spec_from_file_location("fleet_scale_bench", ROOT / "bench" / "fleet_scale_bench.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


BENCH = _bench()
STALE = (f"{BENCH.RECORDING.relative_to(ROOT)} no longer matches the commands llmfleet sends: re-record it with "
         f"`{BENCH.RECORD_COMMAND}` (needs the lab: `invoke lab.setup`) and commit it")


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    work = tmp_path_factory.mktemp("simfleet-replay")
    key = work / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True, timeout=60)
    rec = Recording.load(BENCH.RECORDING)
    assert rec.images_lock, f"{BENCH.RECORDING.name} carries no images lock: {STALE}"
    with pytest.MonkeyPatch.context() as mp, \
            SimFleet(rec, hosts=1, authorized_key=simfleet.public_key(f"{key}.pub"), latency=0) as sim:
        mp.setenv("XDG_CACHE_HOME", str(work / "cache"))  # the simulated host's speeds stay out of the user's
        inv, cfg = BENCH.write_fleet(work, sim.ports, sim.host_key.get_name(), sim.host_key.get_base64(),
                                     rec.host_vars, images_lock=rec.images_lock, key_path=key)
        yield sim, inv, cfg


def _run(argv: list[str]) -> tuple[int, str]:
    from llmfleet.cli.main import program

    out = io.StringIO()
    rc = 0
    with contextlib.redirect_stdout(out):
        try:
            program.run(["llmfleet", *argv])  # a failure exits (SystemExit) with its code
        except SystemExit as exc:
            rc = exc.code if isinstance(exc.code, int) else 1
    return rc, out.getvalue()


@pytest.mark.parametrize(("command", "ends"), [
    ("facts", None),
    ("status", None),
    ("upgrade-check", "check"),
    ("deploy", "unchanged"),  # a no-change deploy, as recorded: the service on its current, healthy release
])
def test_the_recording_answers_every_command_the_controller_sends(fleet, command, ends):
    sim, inv, cfg = fleet
    before = sim.counters.snapshot()
    rc, out = _run(["-f", str(cfg), *BENCH.controller_argv(command, inv, 1)])
    after = sim.counters.snapshot()
    sent = after["commands"] - before["commands"]
    unmatched = after["unmatched"] - before["unmatched"]
    new = after["unmatched_examples"][len(before["unmatched_examples"]):]
    assert sent > 0, f"{command}: sent no command to the simulated host (exit {rc}): {out[-1500:]}"
    assert unmatched == 0, (f"{command}: {unmatched} of {sent} commands have no recorded answer, e.g. "
                            f"{[c[:160] for c in new]}\n{STALE}")
    assert rc == 0, f"{command}: exit {rc}: {out[-2000:]}\n{STALE}"
    doc = json.loads(out)
    assert not doc.get("unreachable"), f"{command}: {doc['unreachable']}\n{STALE}"
    if ends is not None:
        assert [h.get("result") for h in doc["hosts"]] == [ends], f"{command}: {out[-2000:]}\n{STALE}"


def test_the_recording_names_the_controller_and_host_only_where_they_are_masked():
    """Who ran a deploy and on which host differ between the lab recording and a simulated fleet: masked."""
    assert simfleet.mask('{"who":"root@vm","from":"a@b","host":"lab-node-01"}')[0] == \
        '{\x000\x00,\x001\x00,\x002\x00}'
    rec = Recording(host="lab-node-01", host_vars={})
    rec.add('printf %s \'{"who":"root@vm","host":"lab-node-01"}\'', None, 0, '{"host":"lab-node-01"}\n', "", 0.0)
    got = rec.answer('printf %s \'{"who":"ci@runner","host":"sim-0001"}\'', None)
    assert got is not None and got.stdout == '{"host":"sim-0001"}\n'
