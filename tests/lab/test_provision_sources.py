"""Package sources as inventory data on a bare lab host: its baked-in lab source removed, the inventory's
``llmfleet_apt_sources`` names the lab repository with its ASCII-armored key; `--check --diff` shows the
deb822 file and the key it would write, a key that is not armored is refused in one line before any host
is contacted, and the run installs everything from the inventory's source; a second run is converged."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
import yaml

from tests.lab.test_provision import _json, invoke

pytestmark = pytest.mark.lab

HOST = "gpu-bare-06"
LIST = "/etc/apt/sources.list.d/llmfleet-lab.sources"
OURS = "/etc/apt/sources.list.d/llmfleet-lab-repo.sources"


def _armored_key() -> str:
    from llmfleet.lab import aptrepo

    home = aptrepo.root_dir() / "gnupg"
    out = subprocess.run(["gpg", "--homedir", str(home), "--armor", "--export"], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    assert "BEGIN PGP PUBLIC KEY BLOCK" in out
    return out


def test_sources_from_the_inventory_carry_a_bare_host_to_serving_state(lab, tmp_path):
    from llmfleet.lab import aptrepo

    lab.ensure_hosts(HOST)
    lab.exec(HOST, ["rm", "-f", LIST])  # no package source left on the host
    inv = tmp_path / "inventory"
    shutil.copytree(lab.inventory_path, inv)
    keys = tmp_path / "keys"  # beside the inventory folder: a file inside it would be read as inventory
    keys.mkdir()
    (keys / "lab.asc").write_text("not a key\n")
    (inv / "host_vars").mkdir(exist_ok=True)
    (inv / "host_vars" / f"{HOST}.yml").write_text(yaml.safe_dump({"llmfleet_apt_sources": [{
        "name": "lab-repo", "uris": [aptrepo.URL], "suites": [aptrepo.SUITE], "components": list(aptrepo.COMPONENTS),
        "key_file": "../keys/lab.asc"}]}))

    class L:  # the lab, with this inventory
        def __getattr__(self, name):
            return getattr(lab, name)
        inventory_path = str(inv)

    # a key that is not armored: one line, exit 2, nothing changed on the host
    bad = invoke(L(), tmp_path, "provision", "--host", HOST, "--check")
    assert bad.returncode == 2, bad.stdout + bad.stderr
    line = [ln for ln in bad.stderr.splitlines() if ln.strip()]
    assert len(line) == 1 and f"host {HOST}: llmfleet_apt_sources[0].key_file" in line[0] and "--armor" in line[0]

    (keys / "lab.asc").write_text(_armored_key())
    chk = _json(invoke(L(), tmp_path, "provision", "--host", HOST, "--check", "--diff", "--json"))["hosts"][0]
    sources = chk["steps"][0]
    assert sources["name"] == "sources", chk
    assert f"write {OURS} (new, 0644 root:root)" in sources["changes"]
    assert "URIs: http://lab-apt/packages" in sources["diff"] and "Signed-By: /etc/apt/keyrings/llmfleet-lab-repo.asc" \
        in sources["diff"]
    assert lab.exec(HOST, ["test", "-e", OURS], check=False).returncode != 0  # --check wrote nothing

    run = invoke(L(), tmp_path, "provision", "--host", HOST, "--yes", "--json")
    o = _json(run)["hosts"][0]
    assert run.returncode == 0, json.dumps(o, indent=1)[-3000:]
    assert o["result"] == "changed" and {c["id"]: c["status"] for c in o["checks"]}["driver"] == "pass"
    policy = lab.exec(HOST, ["apt-cache", "policy", "nvidia-driver"]).stdout
    assert "http://lab-apt/packages" in policy
    assert lab.exec(HOST, ["ls", "/etc/apt/sources.list.d"]).stdout.split() == ["llmfleet-lab-repo.sources"]
    again = _json(invoke(L(), tmp_path, "provision", "--host", HOST, "--json"))["hosts"][0]
    assert (again["result"], again["round_trips"]) == ("converged", 1)
