"""`invoke provision`'s table and lines for people: every result a host can end in prints (a result
without a style of its own once crashed the line), and a gated driver change says what it kept, what
it stopped and started, and how the go-back went."""

from __future__ import annotations

import pytest

from llmfleet.cli.provision_tasks import _print
from llmfleet.provision.run import Outcome, StepReport

GATE = {"previous": "535.247.01", "kept": ["nvidia-driver", "nvidia-smi"], "services": ["tiny"],
        "health": "tiny: stage container failed",
        "go_back": {"result": "changed", "message": "back on driver 535.247.01",
                    "checks": [{"id": "driver", "status": "pass", "message": "nvidia-smi reports 535.247.01"}]},
        "health_after_go_back": "tiny: healthy, decode 2000.0 tok/s"}


@pytest.mark.parametrize("result", ["converged", "would change", "changed", "failed", "refused", "went back",
                                    "not run", "something new"])
def test_every_result_prints(result, capsys):
    o = Outcome("gpu-bare-04", result=result, message="[why] it ended so", round_trips=3, seconds=1.5)
    o.steps = [StepReport("driver", ["change nvidia-driver 535 -> 580"], "changed" if result != "not run" else result,
                          True)]
    o.checks = [{"id": "driver", "status": "odd", "message": "nvidia-smi reports 580.95.05"}]
    _print(o, False)
    out = capsys.readouterr().out
    assert f"gpu-bare-04: {result}: [why] it ended so (3 round trip(s), 1.50 s)" in out
    assert "driver: ODD nvidia-smi reports 580.95.05" in out


def test_a_gated_change_says_what_it_kept_stopped_and_how_the_go_back_went(capsys):
    o = Outcome("gpu-bare-04", result="went back", message="back on 535.247.01", rebooted=True, reboot_seconds=2.1,
                gate=GATE)
    _print(o, False)
    out = capsys.readouterr().out
    assert "previous driver 535.247.01 kept on the host (2 package(s)); services stopped: tiny" in out
    assert "services on the new driver: tiny: stage container failed" in out
    assert "go-back: changed: back on driver 535.247.01 (driver: PASS nvidia-smi reports 535.247.01)" in out
    assert "services on the old driver again: tiny: healthy, decode 2000.0 tok/s" in out


def test_check_says_a_driver_change_on_a_host_with_a_driver_is_gated(capsys):
    from llmfleet.provision.driver_change import Previous

    o = Outcome("gpu-bare-03", result="would change", previous=Previous("535.247.01", (), ()))
    o.steps = [StepReport("driver", ["change nvidia-driver 535.247.01-1~deb12u1 -> 580.95.05-1"], "would change", True)]
    _print(o, False)
    assert "gated: driver 535.247.01 is kept on the host for a go-back" in capsys.readouterr().out
    o.steps = [StepReport("files", ["write /etc/x"], "would change")]
    _print(o, False)
    assert "gated" not in capsys.readouterr().out
