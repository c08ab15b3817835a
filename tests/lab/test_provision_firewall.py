"""``llmfleet_firewall`` on a bare lab host: provisioning installs nftables, writes and loads the rule,
and the service's port then answers a lab host the inventory allows and drops one it does not (the
deploy's own health check, through SSH on the host's loopback, still passes); a second run is
converged in one round trip; with the variable removed, the next run removes the rule and the port
answers everyone again."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml

from llmfleet.lab import docker as lab_docker
from tests.lab.test_provision import _json, invoke

pytestmark = pytest.mark.lab

HOST, ALLOWED, OTHER = "gpu-bare-09", "gpu-v100-01", "gpu-t4-01"


def _address(lab, host: str) -> str:
    return lab_docker.out(["inspect", "-f", f'{{{{(index .NetworkSettings.Networks "{lab.name}").IPAddress}}}}',
                           lab.container(host)])


def _answers(lab, client: str, url: str) -> bool:
    res = lab.exec(client, ["sh", "-c", f"curl -sS -m 4 -o /dev/null -w '%{{http_code}}' {url}"], check=False)
    return res.returncode == 0 and res.stdout.strip() == "200"


def test_the_service_port_answers_only_the_inventorys_addresses(lab, tmp_path):
    lab.ensure_hosts(HOST, ALLOWED, OTHER)
    inv = tmp_path / "inventory"
    shutil.copytree(lab.inventory_path, inv)
    (inv / "host_vars").mkdir(exist_ok=True)
    walled = inv / "host_vars" / f"{HOST}.yml"
    # the service on every address (the lab's others bind to loopback), no key: the firewall is what keeps it
    reachable = {"llmfleet_bind_address": "0.0.0.0", "llmfleet_allow_unauthenticated": True}
    walled.write_text(yaml.safe_dump({**reachable, "llmfleet_firewall": {
        "allow": [f"{_address(lab, ALLOWED)}/32", "fd00::/64"]}}))

    class L:  # the lab, with this inventory
        def __getattr__(self, name):
            return getattr(lab, name)
        inventory_path = str(inv)

    chk = _json(invoke(L(), tmp_path, "provision", "--host", HOST, "--check", "--diff", "--json"))["hosts"][0]
    fw = next(s for s in chk["steps"] if s["name"] == "firewall")
    assert "write /etc/llmfleet/firewall.nft (new, 0644 root:root)" in fw["changes"] and "ip saddr @allow4" in fw["diff"]

    run = invoke(L(), tmp_path, "provision", "--host", HOST, "--yes", "--json")
    o = _json(run)["hosts"][0]
    assert run.returncode == 0, json.dumps(o, indent=1)[-3000:]
    table = lab.exec(HOST, ["nft", "list", "table", "inet", "llmfleet"]).stdout
    assert _address(lab, ALLOWED) in table and "drop" in table
    assert lab.exec(HOST, ["systemctl", "is-enabled", "llmfleet-firewall.service"]).stdout.strip() == "enabled"

    lab.stage_models(HOST)
    dep = invoke(L(), tmp_path, "deploy", "--host", HOST, "--json")
    assert dep.returncode == 0, dep.stdout[-3000:] + dep.stderr[-2000:]  # its health check: on the host's loopback
    port = next(s["port"] for s in yaml.safe_load((inv / "group_vars" / "all.yml").read_text())["llmfleet_services"]
                if s["name"] == "tiny")
    url = f"http://{_address(lab, HOST)}:{port}/health"
    assert _answers(lab, ALLOWED, url)
    assert not _answers(lab, OTHER, url)
    assert lab.exec(HOST, ["sh", "-c", f"curl -sf -m 4 -o /dev/null http://127.0.0.1:{port}/health"],
                    check=False).returncode == 0

    again = _json(invoke(L(), tmp_path, "provision", "--host", HOST, "--json"))["hosts"][0]
    assert (again["result"], again["round_trips"]) == ("converged", 1)

    walled.write_text(yaml.safe_dump(reachable))
    gone = _json(invoke(L(), tmp_path, "provision", "--host", HOST, "--json"))["hosts"][0]
    assert [s["name"] for s in gone["steps"]] == ["firewall"] and gone["result"] == "changed", gone
    assert lab.exec(HOST, ["nft", "list", "table", "inet", "llmfleet"], check=False).returncode != 0
    assert _answers(lab, OTHER, url)
