"""``llmfleet_firewall``: the service ports answer only the inventory's addresses. The rule's text, the
inventory's validation, and the firewall step (written and loaded, re-enabled, removed when unset)."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from llmfleet.errors import UsageError
from llmfleet.inventory.services import HostSettings, host_settings
from llmfleet.provision import desired as D
from llmfleet.provision import steps as S
from llmfleet.provision.facts import FileState
from tests.test_provision_steps import SETTINGS, bare, converged

WALLED = SETTINGS.model_copy(update={"firewall": HostSettings.model_validate(
    {"firewall": {"allow": ["10.0.0.0/8", "192.168.1.7", "fd00::/64"]}}).firewall})


def desired(settings: HostSettings = WALLED) -> D.Desired:
    return D.desired_state("gpu-bare-01", settings, bare(), user="deploy")


def test_the_rule_drops_other_addresses_on_the_service_ports_only():
    text = D.firewall_text([8000, 8080, 8000], ["10.0.0.0/8", "192.168.1.7", "fd00::/64"])
    assert "elements = { 10.0.0.0/8, 192.168.1.7/32 }" in text and "elements = { fd00::/64 }" in text
    assert "type filter hook prerouting priority -150; policy accept;" in text  # before Docker's DNAT (-100)
    body = text.splitlines()
    rules = body[body.index('\t\tiifname "lo" accept'):]
    assert rules[:4] == ['\t\tiifname "lo" accept', "\t\ttcp dport { 8000, 8080 } ip saddr @allow4 accept",
                         "\t\ttcp dport { 8000, 8080 } ip6 saddr @allow6 accept", "\t\ttcp dport { 8000, 8080 } drop"]
    assert body[1:3] == ["table inet llmfleet", "delete table inet llmfleet"]  # replaced whole, in one transaction
    assert "elements" not in D.firewall_text([8000], ["10.0.0.1"]).split("set allow6", 1)[1]  # no IPv6: an empty set


@pytest.mark.skipif(shutil.which("nft") is None, reason="nft is not installed here (the lab test loads the rule)")
def test_nft_accepts_the_rule(tmp_path):
    rule = tmp_path / "r.nft"
    for allow in (["10.0.0.0/8", "10.1.2.3"], ["fd00::1"], ["0.0.0.0/0"]):
        rule.write_text(D.firewall_text([8000, 9100], allow))
        res = subprocess.run(["nft", "-c", "-f", str(rule)], capture_output=True, text=True)
        if res.returncode != 0 and "Operation not permitted" in res.stderr:
            pytest.skip("nft -c needs CAP_NET_ADMIN here")
        assert res.returncode == 0, (allow, res.stderr)


@pytest.mark.parametrize("bad", ["10.0.0.300", "lab-host", "10.0.0.0/33", ""])
def test_an_address_that_is_not_one_is_named_with_an_example(bad):
    with pytest.raises(UsageError) as e:
        host_settings("gpu-bare-01", {"llmfleet_firewall": {"allow": [bad]}})
    assert f"{bad!r} is not an IP address or network" in str(e.value) and "10.0.0.0/24" in str(e.value)


def test_an_empty_allow_list_is_refused():
    with pytest.raises(UsageError, match="allow"):
        host_settings("gpu-bare-01", {"llmfleet_firewall": {"allow": []}})


def test_a_bare_host_gets_nftables_and_the_firewall_step_after_the_folders():
    d = desired()
    assert "nftables" in [p.name for p in d.packages if p.role == "runtime"]
    steps = S.plan_steps(d, bare())
    names = [s.name for s in steps]
    assert names.index("folders") < names.index("firewall") < names.index("docker-runtime-config")
    fw = steps[names.index("firewall")]
    lines = fw.script.splitlines()
    check = next(i for i, ln in enumerate(lines) if ln.startswith("nft -c -f"))
    write = next(i for i, ln in enumerate(lines) if ln.startswith("mv -f -- /etc/llmfleet/firewall.nft.llmfleet-new"))
    assert check < write  # a rule that does not load is never put in place
    assert lines[-3:] == ["systemctl daemon-reload", f"systemctl enable {D.FIREWALL_UNIT}",
                          f"systemctl restart {D.FIREWALL_UNIT}"]
    assert f"write {D.FIREWALL_FILE} (new, 0644 root:root)" in fw.changes and "+table inet llmfleet {" in fw.diff


def test_no_firewall_no_package_no_step():
    d = desired(SETTINGS)
    assert "nftables" not in [p.name for p in d.packages] and "firewall" not in [s.name for s in S.plan_steps(d, bare())]


def test_a_converged_rule_is_no_step_a_stopped_one_is_started_again():
    d = desired()
    f = converged(d)
    f.units[D.FIREWALL_UNIT] = ("enabled", "active")
    assert S.plan_steps(d, f) == []
    f.units[D.FIREWALL_UNIT] = ("enabled", "inactive")
    (step,) = S.plan_steps(d, f)
    assert step.name == "firewall" and step.changes == (f"enable and start {D.FIREWALL_UNIT} (now enabled, inactive)",)
    assert "mv -f" not in step.script  # nothing written: the file is as it should be


def test_a_changed_allow_list_rewrites_and_reloads_the_rule():
    d = desired()
    f = converged(d)
    f.units[D.FIREWALL_UNIT] = ("enabled", "active")
    f.files[D.FIREWALL_FILE] = FileState(True, "644", "root", "root", D.firewall_text([8000], ["10.9.9.9"]).encode())
    (step,) = S.plan_steps(d, f)
    assert step.changes == (f"write {D.FIREWALL_FILE} (content)",) and "-\t\telements = { 10.9.9.9/32 }" in step.diff
    assert f"systemctl restart {D.FIREWALL_UNIT}" in step.script


def test_a_rule_the_inventory_no_longer_sets_is_removed():
    d = desired(SETTINGS)
    f = converged(d)
    f.files[D.FIREWALL_FILE] = FileState(True, "644", "root", "root", b"old")
    f.files[D.FIREWALL_UNIT_FILE] = FileState(True, "644", "root", "root", b"old")
    f.units[D.FIREWALL_UNIT] = ("enabled", "active")
    (step,) = S.plan_steps(d, f)
    assert step.name == "firewall" and step.changes[0].startswith("remove the firewall rule (llmfleet_firewall is not set)")
    assert "nft delete table inet llmfleet" in step.script and f"rm -f -- {D.FIREWALL_FILE} {D.FIREWALL_UNIT_FILE}" \
        in step.script


def test_the_facts_read_the_rule_and_its_unit_whether_set_or_not():
    q = D.facts_query(SETTINGS, "deploy")
    assert D.FIREWALL_FILE in q.files and D.FIREWALL_UNIT_FILE in q.files and D.FIREWALL_UNIT in q.units
