"""A driver change gated by serving (provision/gated.py, provision/driver_change.py): the previous driver
kept, the services stopped and started around the change, the go-back when the host does not come back
healthy; and the pure parts (which packages are the previous driver, the go-back's exact commands)."""

from __future__ import annotations

import pytest

from llmfleet.provision import driver_change as DC
from llmfleet.provision import facts as F
from llmfleet.provision import gated as G
from llmfleet.provision.run import Outcome, StepReport

PREV = DC.Previous("570.172.08", (("nvidia-driver", "570.172.08-1"), ("nvidia-kernel-dkms", "570.172.08-1"),
                                  ("nvidia-smi", "570.172.08-1")), ("nvidia-driver", "nvidia-kernel-dkms", "nvidia-smi"))
FILES = {n: f"{n}_{v}_amd64.deb" for n, v in PREV.packages}


def pkgs(**versions: str) -> dict[str, F.PkgState]:
    return {n.replace("_", "-"): F.PkgState(v, "ii ") for n, v in versions.items()}


# -- the pure parts ------------------------------------------------------------------------------------


def test_the_previous_driver_is_every_driver_package_at_the_running_version():
    facts = F.ProvisionFacts(packages=pkgs(nvidia_driver="570.172.08-1", nvidia_kernel_dkms="570.172.08-1",
                                           nvidia_smi="570.172.08-1", libnvidia_container1="1.19.1-1",
                                           nvidia_container_toolkit="1.19.1-1", docker_io="20.10.24"),
                             holds={"nvidia-driver", "nvidia-container-toolkit"}, driver_running="570.172.08")
    prev = DC.previous_driver(facts, "nvidia-driver")
    assert prev == DC.Previous("570.172.08", PREV.packages, ("nvidia-driver",))
    assert prev.folder("/opt/llmfleet") == "/opt/llmfleet/driver-previous/570.172.08"


def test_a_host_without_a_driver_has_nothing_to_go_back_to():
    facts = F.ProvisionFacts(packages=pkgs(docker_io="20.10.24"))
    assert DC.previous_driver(facts, "nvidia-driver") is None


def test_the_go_back_removes_the_other_branchs_packages_not_the_toolkit_nor_the_daemon():
    after = F.ProvisionFacts(packages=pkgs(nvidia_driver_580_server="580.95.05-0ubuntu1",
                                           nvidia_persistenced="550.54.14-1",
                                           nvidia_driver="580.95.05-1", nvidia_container_toolkit="1.19.1-1",
                                           libnvidia_container1="1.19.1-1", nvidia_smi="580.95.05-1"))
    assert DC.go_back_removals(PREV, after, "580.95.05") == ("nvidia-driver-580-server",)
    assert DC.go_back_removals(PREV, after, None) == ()


def test_the_go_back_script_installs_the_kept_files_removes_and_holds_again():
    script = DC.go_back_script("/opt/llmfleet", PREV, FILES, ["nvidia-driver-580-server"], ["nvidia-driver", "docker.io"])
    lines = script.splitlines()
    pin = "\n".join(lines[4:10])
    assert pin.startswith("printf '%s' '# Written by llmfleet provision: the NVIDIA driver stays at 570.172.08-1 (R570)")
    assert "Pin: version 570.172.08-1\nPin-Priority: 1001\n' > /etc/apt/preferences.d/90-llmfleet-nvidia-driver" in pin
    assert lines[:4] + lines[10:] == [
        "set -e",
        "export DEBIAN_FRONTEND=noninteractive",
        "cd -- /opt/llmfleet/driver-previous/570.172.08",
        "apt-mark unhold docker.io nvidia-driver nvidia-kernel-dkms nvidia-smi >/dev/null",
        "apt-get -y -q -o Dpkg::Options::=--force-confold -o DPkg::Lock::Timeout=300 --no-install-recommends "
        "--allow-downgrades --allow-change-held-packages install ./nvidia-driver_570.172.08-1_amd64.deb "
        "./nvidia-kernel-dkms_570.172.08-1_amd64.deb ./nvidia-smi_570.172.08-1_amd64.deb nvidia-driver-580-server-",
        "apt-mark hold nvidia-driver nvidia-kernel-dkms nvidia-smi",
    ]


def test_the_keep_script_quotes_and_reports_what_it_kept():
    script = DC.keep_script("/opt/ll fleet", PREV)
    assert "d='/opt/ll fleet/driver-previous/570.172.08'" in script
    assert "apt-get -q download nvidia-smi=570.172.08-1" in script
    kept, missing = DC.parse_kept("@@kept nvidia-driver nvidia-driver_570.172.08-1_amd64.deb\n@@missing nvidia-smi\nnoise")
    assert kept == {"nvidia-driver": "nvidia-driver_570.172.08-1_amd64.deb"} and missing == ["nvidia-smi"]


@pytest.mark.parametrize("kw, result, ok, says", [
    ({"change_ok": True, "services_ok": True, "services_why": "llm: healthy"}, "changed", True, "570.172.08 -> 580"),
    ({"change_ok": False, "change_why": "driver: nvidia-smi fails", "services_ok": None, "went_back": True,
      "serving_again": True}, "went back", False, "back on 570.172.08, its services serve again"),
    ({"change_ok": True, "services_ok": False, "services_why": "residency FAIL", "went_back": True,
      "serving_again": False, "again_why": "slow"}, "went back", False, "not healthy: slow"),
    ({"change_ok": False, "change_why": "x", "services_ok": None, "went_back": False, "back_why": "apt broke"},
     "failed", False, "going back to 570.172.08 failed too: apt broke"),
])
def test_the_verdict(kw, result, ok, says):
    v = DC.gate_verdict("h1", "580.95.05", PREV, **{"change_why": "", "services_why": "", **kw})
    assert (v.result, v.ok) == (result, ok) and says in v.message


# -- the gated run over fakes ----------------------------------------------------------------------------


class FakeProvisioner:
    def __init__(self, world: World, check: bool) -> None:
        self.world, self.is_check = world, check
        self.settings = type("S", (), {"root": "/opt/llmfleet"})()

    def provision(self) -> Outcome:
        w = self.world
        if self.is_check:
            w.calls.append("check")
            o = Outcome("h1", result=w.check_result, previous=w.previous)
            o.steps = [StepReport(n, [], "would change", n == "driver") for n in w.check_steps]
            return o
        w.calls.append("provision")
        return w.run_outcome()

    def keep_previous(self, prev):
        self.world.calls.append("keep")
        return ({} if self.world.keep_missing else dict(FILES)), (["nvidia-smi"] if self.world.keep_missing else [])

    def go_back(self, prev, files, target):
        self.world.calls.append("go-back")
        assert files == FILES and target == "580.95.05"
        return Outcome("h1", result="changed" if self.world.back_ok else "failed", rebooted=True,
                       message="" if self.world.back_ok else "apt broke", driver={"running": "570.172.08"})


class World:
    def __init__(self, *, check_steps=("driver", "hold"), check_result="would change", previous=PREV,
                 change_ok=True, driver_status="changed", healthy=(True,), back_ok=True, keep_missing=False,
                 stop_fails=False) -> None:
        self.calls: list[str] = []
        self.check_steps, self.check_result, self.previous = check_steps, check_result, previous
        self.change_ok, self.driver_status, self.healthy = change_ok, driver_status, list(healthy)
        self.back_ok, self.keep_missing, self.stop_fails = back_ok, keep_missing, stop_fails

    def run_outcome(self) -> Outcome:
        o = Outcome("h1", result="changed" if self.change_ok else "failed", rebooted=True,
                    driver={"version": "580.95.05", "running": "580.95.05" if self.change_ok else None})
        o.steps = [StepReport("driver", [], self.driver_status, True)]
        if not self.change_ok and self.driver_status != "not run":
            o.checks = [{"id": "driver", "status": "fail", "message": "nvidia-smi reports couldn't communicate"}]
            o.result = "changed"
        elif not self.change_ok:
            o.message = "step toolkit failed: E: boom"
        return o

    def gate(self) -> G.ServiceGate:
        def stop():
            self.calls.append("stop")
            return ["llm"], ("unit failed" if self.stop_fails else None)

        def start(names):
            self.calls.append("start " + ",".join(names))
            ok = self.healthy.pop(0) if self.healthy else True
            return ok, "llm: healthy" if ok else "llm: decode 3 tok/s below the floor"

        return G.ServiceGate(stop=stop, start=start)


def run(world: World, confirm=None) -> Outcome:
    return G.provision_gated(lambda check, ask: FakeProvisioner(world, check), world.gate(), lambda _l: None,
                             confirm=confirm)


def test_a_change_that_serves_keeps_the_old_driver_stops_and_starts_the_services():
    w = World()
    o = run(w)
    assert w.calls == ["check", "keep", "stop", "provision", "start llm"]
    assert o.ok and o.result == "changed" and "570.172.08 -> 580.95.05; llm: healthy" in o.message
    assert o.gate["services"] == ["llm"] and o.to_dict()["previous_driver"]["version"] == "570.172.08"


def test_services_unhealthy_on_the_new_driver_go_back_and_serve_again():
    w = World(healthy=(False, True))
    o = run(w)
    assert w.calls == ["check", "keep", "stop", "provision", "start llm", "go-back", "start llm"]
    assert o.result == "went back" and not o.ok
    assert "not healthy on 580.95.05: llm: decode 3 tok/s" in o.message and "its services serve again" in o.message


def test_a_driver_that_does_not_come_up_goes_back_without_starting_the_services_on_it():
    w = World(change_ok=False)
    o = run(w)
    assert w.calls == ["check", "keep", "stop", "provision", "go-back", "start llm"]
    assert o.result == "went back" and "couldn't communicate" in o.message


def test_a_failed_go_back_is_reported_with_where_the_old_driver_lies():
    w = World(change_ok=False, back_ok=False)
    o = run(w)
    assert o.result == "failed" and "apt broke" in o.message and "driver-previous/570.172.08" in o.message
    assert w.calls[-1] == "go-back"  # nothing started on a host in an unknown state


def test_a_step_before_the_driver_failed_restarts_the_services_without_a_go_back():
    w = World(change_ok=False, driver_status="not run")
    o = run(w)
    assert w.calls == ["check", "keep", "stop", "provision", "start llm"]
    assert o.result == "failed" and "E: boom" in o.message


def test_a_driver_that_cannot_be_kept_refuses_before_any_service_stops():
    w = World(keep_missing=True)
    o = run(w)
    assert w.calls == ["check", "keep"]
    assert o.result == "refused" and "no driver change without a way back" in o.message and not o.ok


def test_not_confirmed_touches_nothing():
    w = World()
    o = run(w, confirm=lambda _o: False)
    assert w.calls == ["check"] and o.result == "refused" and "not confirmed" in o.message


def test_a_stop_that_fails_starts_what_it_stopped_and_changes_no_driver():
    w = World(stop_fails=True)
    o = run(w)
    assert w.calls == ["check", "keep", "stop", "start llm"] and o.result == "failed"


@pytest.mark.parametrize("world", [World(check_steps=("packages-runtime", "toolkit", "driver"), previous=None),
                                   World(check_steps=("files",)), World(check_steps=("reboot",))])
def test_no_gate_without_a_driver_to_go_back_to_or_no_driver_change(world):
    run(world)
    assert world.calls == ["check", "provision"]


def test_a_converged_host_is_the_check_alone():
    w = World(check_result="converged", check_steps=())
    assert run(w).result == "converged" and w.calls == ["check"]
