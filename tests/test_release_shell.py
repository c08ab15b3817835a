"""The deploy shell without a lab: its pure helpers, and what it does against a real sshd on loopback
(host-key refusal, usage errors before any contact, a preflight FAIL that changes nothing, the lock
tasks' remote side). End-to-end deploys run in the lab (tests/lab/test_deploy.py)."""

from __future__ import annotations

import json
import os
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml

from llmfleet.errors import UsageError
from llmfleet.images.lock import ImageLock, LockedImage, resolve
from llmfleet.inventory.ansible import load_inventory
from llmfleet.inventory.services import host_settings
from llmfleet.knowledge.planner import PlanSummary
from llmfleet.knowledge.release_state import Manifest
from llmfleet.release import decide as Dc
from llmfleet.release import deploy as D
from llmfleet.release import executor as E
from llmfleet.release import pipeline as P
from llmfleet.release import store as R
from llmfleet.release.manifest import build as manifest_build
from llmfleet.release.render import render
from llmfleet.release.secret import resolve_secret

DIGEST = "sha256:" + "ef" * 32
NOW = datetime(2026, 11, 29, 12, 0, 0, tzinfo=UTC)


def svc_dict(**kw):
    d = {"name": "chat", "engine": "llamacpp", "model": "tiny", "model_path": "/srv/models/t.gguf",
         "image": "llamacpp:b1", "port": 8080}
    d.update(kw)
    return d


def make_inventory(tmp_path: Path, sshd=None, **svc) -> Path:
    lock = tmp_path / "images.lock"
    lock.write_text(yaml.safe_dump({"images": {"llamacpp:b1": {"repository": "reg.lab/llamacpp", "digest": DIGEST}}}))
    root = tmp_path / "root"
    hv = {
        "ansible_host": "127.0.0.1",
        "ansible_port": sshd.port if sshd else 1,
        "ansible_user": "root",
        "llmfleet_images_lock": str(lock),
        "llmfleet_root": str(root),
        "llmfleet_services": [svc_dict(**svc)],
    }
    if sshd:
        hv["ansible_ssh_private_key_file"] = str(sshd.client_key)
    inv = tmp_path / "inv"
    inv.mkdir(exist_ok=True)
    (inv / "hosts.yml").write_text(yaml.safe_dump({"all": {"hosts": {"h1": hv}}}))
    return inv


def logger():
    lines: list[str] = []
    return lines, lines.append


# ---------------------------------------------------------------------------------------------
# pure helpers


@pytest.mark.parametrize(
    ("overrides", "check"),
    [
        ({}, lambda s: s.image == "llamacpp:b1"),
        ({"image": "llamacpp:b2"}, lambda s: s.image == "llamacpp:b2"),
        ({"context": "4096"}, lambda s: s.context == 4096),
        ({"engine_args": ["-ngl", "99"]}, lambda s: s.engine_args == ["-ngl", "99"]),
    ],
)
def test_apply_overrides(overrides, check):
    s = host_settings("h", {"llmfleet_services": [svc_dict(health={"min_tokps": 5})]}).services[0]
    out = D.apply_overrides(s, overrides, "h/chat")
    assert check(out)
    # what the inventory did not set stays unset (the floor's precedence depends on it)
    assert "floor_fraction" not in out.health.model_fields_set and out.health.min_tokps == 5


@pytest.mark.parametrize("bad", [{"port": "not-a-port"}, {"unknown_key": 1}, {"name": "Bad Name!"}])
def test_bad_overrides_are_usage_errors(bad):
    s = host_settings("h", {"llmfleet_services": [svc_dict()]}).services[0]
    with pytest.raises(UsageError, match="h/chat"):
        D.apply_overrides(s, bad, "h/chat")


def test_resolve_secret(tmp_path, monkeypatch):
    s_env = host_settings("h", {"llmfleet_services": [svc_dict(api_key={"from_env": "T_KEY"})]}).services[0]
    monkeypatch.delenv("T_KEY", raising=False)
    with pytest.raises(UsageError, match="T_KEY is not set"):
        resolve_secret(s_env.api_key, "w")
    monkeypatch.setenv("T_KEY", "k-1")
    assert resolve_secret(s_env.api_key, "w") == "k-1"
    f = tmp_path / "key"
    f.write_text("k-2\n")
    os.chmod(f, 0o644)
    s_file = host_settings("h", {"llmfleet_services": [svc_dict(api_key={"from_file": str(f)})]}).services[0]
    with pytest.raises(UsageError, match="chmod 600"):
        resolve_secret(s_file.api_key, "w")
    os.chmod(f, 0o600)
    assert resolve_secret(s_file.api_key, "w") == "k-2"


def _rendered(**svc):
    lock = ImageLock(images={
        "llamacpp:b1": LockedImage("llamacpp:b1", "reg.lab/llamacpp", DIGEST),
        "llamacpp:b2": LockedImage("llamacpp:b2", "reg.lab/llamacpp", "sha256:" + "12" * 32),
    })
    hs = host_settings("h", {"llmfleet_services": [svc_dict(**svc)]})
    s = hs.services[0]
    return render(s, hs, resolve(s.image, lock), PlanSummary(engine_args=("-ngl", "99")),
                  api_key="sek" if s.api_key else None)


def _manifest(r) -> Manifest:
    return manifest_build(r, "20261129T120000Z-0123456789", host="h", who="w", when=NOW, llmfleet_version="0")


@pytest.mark.parametrize(
    ("new", "says"),
    [
        ({"image": "llamacpp:b2"}, "image reg.lab/llamacpp@sha256:efef"),
        ({"engine_args": ["-c", "1024"]}, "engine args: -[] +[-c 1024]"),
        ({"env": {"OPT": "1"}}, "compose.yml changed"),
    ],
)
def test_describe_change(new, says):
    old = _manifest(_rendered())
    assert any(says in line for line in Dc.describe_change(old, _rendered(**new)))
    assert Dc.describe_change(None, _rendered())[0].startswith("new service")


def test_fetch_current_masks_the_env_file_on_the_host(tmp_path):
    sdir = tmp_path / "services/chat"
    rel = sdir / "releases/20261129T120000Z-0123456789"
    rel.mkdir(parents=True)
    (rel / "compose.yml").write_text("name: x\n")
    (rel / "service.env").write_text("# comment\nLLAMA_API_KEY='sk-very-secret'\n")
    os.symlink("releases/20261129T120000Z-0123456789", sdir / "current")
    out = subprocess.run(["sh", "-c", R.current_files_script(str(tmp_path), ["chat", "other"])],
                         capture_output=True, text=True, timeout=20)
    assert out.returncode == 0
    assert "sk-very-secret" not in out.stdout
    files, env_hash = R.parse_current_files(out.stdout)
    assert files["chat"]["compose.yml"] == "name: x\n"
    assert files["chat"]["service.env"] == "# comment\nLLAMA_API_KEY='********'\n"
    assert len(env_hash["chat"]) == 64 and "other" not in files


def test_unified_diff_of_a_new_file_and_a_change():
    assert P.unified_diff(None, "a\n", "compose.yml").startswith("--- /dev/null")
    d = P.unified_diff("a\nb\n", "a\nc\n", "compose.yml")
    assert "-b" in d and "+c" in d
    assert P.unified_diff("a\n", "a\n", "x") == ""


def test_a_process_that_ended_is_not_alive():
    dead = subprocess.Popen(["true"])
    dead.wait()
    assert not E.pid_alive(dead.pid)
    assert E.pid_alive(os.getpid())


# ---------------------------------------------------------------------------------------------
# usage errors raise before any contact (port 1 is never connected to)


def test_unpinned_image_is_a_usage_error_before_contact(tmp_path):
    inv = make_inventory(tmp_path, image="reg.lab/llamacpp:latest")
    with pytest.raises(UsageError, match="floating tag"):
        D.deploy_host(str(inv), "h1", config={}, options=D.DeployOptions(), log=lambda _: None)


def test_unresolved_secret_is_a_usage_error_before_contact(tmp_path, monkeypatch):
    monkeypatch.delenv("NOPE_KEY", raising=False)
    inv = make_inventory(tmp_path, api_key={"from_env": "NOPE_KEY"})
    with pytest.raises(UsageError, match="NOPE_KEY"):
        D.deploy_host(str(inv), "h1", config={}, options=D.DeployOptions(), log=lambda _: None)


def test_unknown_host_and_bad_release_id_are_usage_errors(tmp_path):
    inv = make_inventory(tmp_path)
    with pytest.raises(UsageError, match="no host"):
        D.deploy_host(str(inv), "nope", config={}, options=D.DeployOptions(), log=lambda _: None)
    with pytest.raises(UsageError, match="not a release id"):
        D.rollback_host(str(inv), "h1", to="../../etc", config={}, options=D.DeployOptions(), log=lambda _: None)


# ---------------------------------------------------------------------------------------------
# against a real sshd


def test_unknown_host_key_refuses_the_deploy(sshd, tmp_path):
    inv = make_inventory(tmp_path, sshd)
    kh = tmp_path / "kh"
    o = D.deploy_host(str(inv), "h1", config={"known_hosts": str(kh), "audit_log": str(tmp_path / "a.jsonl")},
                      options=D.DeployOptions(), log=lambda _: None)
    assert o.result == "refused"
    assert "unknown host key" in o.reason and "SHA256:" in o.reason and "--accept-new-host-keys" in o.reason
    assert not kh.exists() and not (tmp_path / "root").exists()
    assert json.loads((tmp_path / "a.jsonl").read_text())["result"] == "refused"  # audited locally


def test_a_failed_preflight_changes_nothing(sshd, tmp_path):
    # this machine has no GPU runtime for the pinned image: the preflight fails, nothing is written
    inv = make_inventory(tmp_path, sshd)
    lines, log = logger()
    o = D.deploy_host(str(inv), "h1", config={"known_hosts": str(tmp_path / "kh"), "audit_log": str(tmp_path / "a")},
                      options=D.DeployOptions(accept_new_host_keys=True), log=log)
    assert o.result == "refused" and o.reason.startswith("preflight failed")
    assert o.preflight and not o.preflight[0]["ok"]
    # nothing but the audit line: no release, no lock
    assert sorted(p.name for p in (tmp_path / "root").iterdir()) == ["audit.jsonl"]
    rec = json.loads((tmp_path / "root" / "audit.jsonl").read_text())
    assert (rec["action"], rec["result"]) == ("deploy", "refused") and "preflight failed" in rec["detail"]
    assert json.loads((tmp_path / "a").read_text())["result"] == "refused"
    assert o.round_trips == 2  # the facts probe and the audit line


def test_lock_status_and_break_over_ssh(sshd, tmp_path):
    inv = load_inventory(str(make_inventory(tmp_path, sshd)))
    h = inv.hosts["h1"]
    settings = inv.settings_for(h)
    conf = {"known_hosts": str(tmp_path / "kh"), "audit_log": str(tmp_path / "local.jsonl")}
    st = E.lock_status(h, settings, config=conf, accept_new_host_keys=True)
    assert st["held"] is False and st["description"] == "free"
    holder = R.holder_document(token="t", who="alice", origin="alice@ws", action="deploy", message="canary",
                               now=datetime.now(UTC), pid=1)
    subprocess.run(["sh", "-c", R.lock_acquire_script(settings.root, holder)], check=True, timeout=10)
    st = E.lock_status(h, settings, config=conf)
    assert st["held"] and "alice" in st["description"] and "canary" in st["description"]
    br = E.lock_break(h, settings, config=conf, who="ops@here")
    assert br["broken"] and br["holder"]["who"] == "alice"
    assert E.lock_status(h, settings, config=conf)["held"] is False
    remote_audit = [json.loads(x) for x in Path(R.audit_path(settings.root)).read_text().splitlines()]
    local_audit = [json.loads(x) for x in (tmp_path / "local.jsonl").read_text().splitlines()]
    assert remote_audit[-1]["action"] == local_audit[-1]["action"] == "lock-break"
    assert remote_audit[-1]["who"] == "ops@here"
    assert E.lock_break(h, settings, config=conf)["broken"] is False


def test_an_older_release_is_health_checked_as_it_ran():
    inv_svc = host_settings("h", {"llmfleet_services": [svc_dict(port=9000, served_name="new-name")]}).services[0]
    old = host_settings("h", {"llmfleet_services": [svc_dict(health={"min_tokps": 3})]}).services[0]
    manifest = Manifest(release="r", service="chat", inputs=old.model_dump(mode="json", exclude_unset=True))
    s = E.service_for_release(inv_svc, manifest)
    assert (s.port, s.public_name, s.health.min_tokps) == (8080, "chat", 3)
    assert "floor_fraction" not in s.health.model_fields_set  # the host's floor settings still apply
    assert E.service_for_release(inv_svc, None) is inv_svc


def test_the_engine_log_summary_keeps_the_root_cause():
    log = "\n".join([
        "\x1b[2K(EngineCore pid=26) ERROR 11-29 [core.py:1510] EngineCore failed to start.",
        "Traceback (most recent call last):",
        '  File "/opt/vllm/core.py", line 144, in __init__',
        "RuntimeError: Insufficient space in /dev/shm for shared-memory allocation: 160 MiB required, 64 MiB free.",
    ] + [f"noise {i}" for i in range(50)] + ["llmfleet-x exited with code 1", "Failed with result 'exit-code'."])
    s = E.summarize_log(log)
    assert "Insufficient space in /dev/shm" in s and "exited with code 1" in s
    assert "\x1b" not in s and "File " not in s and "noise 3 " not in s
    assert E.summarize_log("") == ""


def test_an_unreachable_host_is_a_failed_outcome_not_an_exception(tmp_path):
    inv = make_inventory(tmp_path)  # port 1 on loopback: nothing listens there
    o = D.deploy_host(str(inv), "h1", config={"known_hosts": str(tmp_path / "kh"), "connect_timeout": 3},
                      options=D.DeployOptions(), log=lambda _: None)
    assert o.result == "failed" and "cannot connect" in o.reason and o.round_trips == 0
    r = D.rollback_host(str(inv), "h1", config={"known_hosts": str(tmp_path / "kh"), "connect_timeout": 3},
                        options=D.DeployOptions(), log=lambda _: None)
    assert r.result == "failed" and "cannot connect" in r.reason
