"""An air-gapped site in the lab, from a bare host to serving: ``bundle.create --packages-from`` has a
connected bare host (gpu-bare-08) download what provisioning installs on the air-gapped one (gpu-bare-07:
Docker, compose, the container toolkit and the driver, all SIMULATOR stand-ins for the NVIDIA parts, from
the lab's package repository) into the bundle beside the images and the model; then the lab's package
repository AND its registry are disconnected from the lab network and:

- ``provision --bundle --check`` lists the offline-repo step first and changes nothing;
- ``provision --bundle`` sends the packages' archive, checks its sha256 on the host, installs only from it
  (apt reads no other source), reboots once and verifies the driver; a second run is converged in one
  round trip without sending anything;
- ``deploy --bundle`` then serves on the host, its image loaded from the same bundle (the model staged
  as a site copies it);
- a bundle built for another distribution release is refused in one line before the host changes, and
  one with a damaged package archive is refused naming the file (exit 1).

Both are connected again in a ``finally``; the staging host is left as it was.
"""

from __future__ import annotations

import json
import shutil
import time

import pytest

from llmfleet.lab import aptrepo
from llmfleet.lab import docker as lab_docker
from llmfleet.lab import hosts as lab_hosts
from tests.lab.test_provision import _json, invoke

pytestmark = pytest.mark.lab

HOST, STAGING = "gpu-bare-07", "gpu-bare-08"


def _reachable(lab, url: str) -> bool:
    res = lab.exec(HOST, ["sh", "-c", f"curl -sS -m 5 -o /dev/null -w '%{{http_code}}' {url}"], check=False)
    return res.returncode == 0 and res.stdout.strip() in {"200", "301", "302", "403"}


def _staging_state(lab) -> str:
    return lab.exec(STAGING, ["sh", "-c", "dpkg-query -W -f '${Package} ${Version}\\n' | sha256sum; "
                                          "ls /var/cache/apt/archives /var/tmp; apt-mark showhold"]).stdout


def test_an_air_gapped_bare_host_provisions_and_deploys_from_one_bundle(lab, tmp_path):
    lab.ensure_hosts(HOST, STAGING)
    staging_before = _staging_state(lab)
    out = tmp_path / "site"
    made = invoke(lab, tmp_path, "bundle.create", str(out), "--host", HOST, "--packages-from", STAGING,
                  "--mirror", f"{lab.registry_inner}={lab.registry}", "--json")
    doc = _json(made)
    assert made.returncode == 0, made.stderr[-3000:]
    (pk,) = doc["packages"]
    assert (pk["distro"], pk["version"], pk["arch"], pk["archive"]) == ("debian", "12", "amd64",
                                                                          "packages/debian-12-amd64.tar")
    names = {p.split("=", 1)[0] for p in pk["packages"]}
    assert {"docker.io", "docker-compose", "nvidia-container-toolkit", "nvidia-driver"} <= names, sorted(names)
    (entry,) = [f for f in doc["files"] if f["path"] == pk["archive"]]
    print(f"{STAGING} downloaded {len(pk['packages'])} packages for {HOST}, {entry['size'] / 1e6:.1f} MB")
    assert _staging_state(lab) == staging_before  # the staging host downloaded into a work folder it removed

    # a damaged archive: refused naming the file before any host is contacted
    bad = tmp_path / "damaged"
    shutil.copytree(out, bad)
    with open(bad / pk["archive"], "r+b") as fh:
        fh.seek(2000)
        byte = fh.read(1)
        fh.seek(2000)
        fh.write(bytes([byte[0] ^ 0xFF]))
    refused = invoke(lab, tmp_path, "provision", "--host", HOST, "--bundle", str(bad), "--check")
    assert refused.returncode == 1 and pk["archive"] in refused.stderr, refused.stdout + refused.stderr

    apt_url, registry_url = f"{aptrepo.URL}/", f"http://{lab.registry_inner}/v2/"
    assert _reachable(lab, apt_url)
    lab_docker.run(["network", "disconnect", lab.name, aptrepo.CONTAINER])
    lab_docker.run(["network", "disconnect", lab.name, lab_hosts.REGISTRY_CONTAINER])
    try:
        assert not _reachable(lab, apt_url) and not _reachable(lab, registry_url)

        # another release's bundle: one line naming what the bundle has, nothing changed
        other = tmp_path / "other"
        shutil.copytree(out, other)
        top = json.loads((other / "bundle.json").read_text())
        top["packages"][0]["version"] = "13"
        (other / "bundle.json").write_text(json.dumps(top))
        wrong = _json(invoke(lab, tmp_path, "provision", "--host", HOST, "--bundle", str(other), "--json"))["hosts"][0]
        assert wrong["result"] == "refused" and "carries no packages for debian 12 amd64 (it has: debian 13 amd64)" \
            in wrong["message"], wrong

        chk = _json(invoke(lab, tmp_path, "provision", "--host", HOST, "--bundle", str(out), "--check", "--json"))
        steps = [s["name"] for s in chk["hosts"][0]["steps"]]
        assert steps[:2] == ["offline-repo", "sources"] and "driver" in steps, steps
        assert lab.exec(HOST, ["test", "-e", "/opt/llmfleet/packages"], check=False).returncode != 0

        t0 = time.monotonic()
        run = invoke(lab, tmp_path, "provision", "--host", HOST, "--bundle", str(out), "--yes", "--json")
        o = _json(run)["hosts"][0]
        assert run.returncode == 0, json.dumps(o, indent=1)[-4000:]
        print(f"{HOST}: provisioned from the bundle in {time.monotonic() - t0:.1f} s, {o['round_trips']} round trips")
        assert o["result"] == "changed" and o["rebooted"], o["message"]
        assert {c["id"]: c["status"] for c in o["checks"]}["driver"] == "pass"
        sha = next(f["sha256"] for f in doc["files"] if f["path"] == pk["archive"])
        marker = f"/opt/llmfleet/packages/{sha.split(':')[1][:12]}/Packages.ok"
        assert lab.exec(HOST, ["cat", marker]).stdout.strip() == sha  # unpacked after its sha256 was checked
        assert o["steps"][0]["name"] == "offline-repo" and o["steps"][0]["status"] == "changed"
        policy = lab.exec(HOST, ["apt-cache", "policy", "docker.io"]).stdout  # installed, from no mirror
        assert "Installed: (none)" not in policy
        again = _json(invoke(lab, tmp_path, "provision", "--host", HOST, "--bundle", str(out), "--json"))["hosts"][0]
        assert (again["result"], again["round_trips"]) == ("converged", 1)

        # the same bundle deploys the service: its image loaded from it, no registry (the model is staged
        # as a site copies it; tests/lab/test_bundle.py pushes one from a bundle)
        lab.stage_models(HOST)
        dep = invoke(lab, tmp_path, "deploy", "--host", HOST, "--bundle", str(out), "--json")
        assert dep.returncode == 0, (dep.stdout + dep.stderr)[-3000:]
        assert json.loads(dep.stdout)["hosts"][0]["result"] == "deployed"
        assert "loaded from the bundle" in dep.stderr
        assert not _reachable(lab, apt_url) and not _reachable(lab, registry_url)
    finally:
        aptrepo.connect(lab.name)
        lab_hosts.connect_registry(lab.name)
