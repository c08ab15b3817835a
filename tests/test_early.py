"""Connections opened early and commands sent ahead (``llmfleet.host.early``, ``Remote.send_ahead``),
against a real OpenSSH server on loopback: a deploy's probe goes out while the controller still loads
its code, and is still one round trip; what nobody takes is closed; errors reach the deploy as before."""

from __future__ import annotations

import os

import pytest
import yaml

from llmfleet.errors import RemoteError
from llmfleet.host import early
from llmfleet.host import facts as facts_mod
from llmfleet.host.ssh import HostKeyError, connect
from llmfleet.inventory.ansible import Host, load_inventory
from llmfleet.release.decide import Refusal
from llmfleet.release.executor import connect as executor_connect
from llmfleet.release.prepare import DeployOptions, prepare_host
from llmfleet.settings import Settings


@pytest.fixture
def host(sshd):
    return Host(name="test-host", vars={"ansible_host": "127.0.0.1", "ansible_port": sshd.port,
                                        "ansible_user": "root", "ansible_ssh_private_key_file": str(sshd.client_key)})


@pytest.fixture
def settings(tmp_path):
    return Settings.of({"ssh": {"known_hosts": str(tmp_path / "kh")}})


@pytest.fixture(autouse=True)
def _nothing_left():
    yield
    early.close_all()


def test_a_command_sent_ahead_is_taken_by_the_same_run_in_one_round_trip(host, tmp_path):
    with connect(host, config={"known_hosts": str(tmp_path / "kh")}, accept_new_host_keys=True) as remote:
        remote.send_ahead(["sh", "-c", "echo $$; cat"], stdin=b"in")
        res = remote.run(["sh", "-c", "echo $$; cat"], stdin=b"in")
        assert remote.round_trips == 1
        pid, echoed = res.stdout.split("\n", 1)
        assert echoed == "in" and pid.isdigit()
        # another command (or other stdin) is sent as usual; the answer sent ahead is not reused
        remote.send_ahead(["sh", "-c", "echo $$"])
        again = remote.run(["sh", "-c", "echo $$"], stdin=b"other")
        assert again.stdout.strip() != pid
        assert remote.round_trips == 3


def test_a_command_sent_ahead_keeps_its_failure_for_the_run(host, tmp_path):
    with connect(host, config={"known_hosts": str(tmp_path / "kh")}, accept_new_host_keys=True) as remote:
        remote.send_ahead(["sh", "-c", "exit 7"])
        assert remote.run(["sh", "-c", "exit 7"]).rc == 7
        remote.send_ahead(["sh", "-c", "exit 3"])
        with pytest.raises(RemoteError, match=r"exit 3"):
            remote.run(["sh", "-c", "exit 3"], check=True)
        remote.send_ahead(["sleep", "5"], timeout=0.5)
        with pytest.raises(RemoteError, match="timed out"):
            remote.run(["sleep", "5"])


def _prepared(sshd, tmp_path, host_vars=None):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF" + b"\0" * 60)
    service = {"name": "tiny", "engine": "llamacpp", "model": "qwen2.5-7b-instruct", "model_path": str(model),
               "image": "llamacpp:b5000-cu122", "quant": "q4_k_m", "port": 18777, "context": 4096}
    vars_ = {"ansible_host": "127.0.0.1", "ansible_port": sshd.port, "ansible_user": "root",
             "ansible_ssh_private_key_file": str(sshd.client_key), "llmfleet_root": str(tmp_path / "root"),
             "llmfleet_services": [service], **(host_vars or {})}
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump({"all": {"hosts": {"test-host": vars_}}}))
    inv = load_inventory(tmp_path / "hosts.yml")
    return inv, prepare_host(inv, "test-host", Settings.of({}), DeployOptions(allow_unpinned=True))


def test_early_connection_and_probe_are_what_the_deploy_takes(sshd, tmp_path, settings):
    inv, ready = _prepared(sshd, tmp_path)
    assert early.start([ready], settings, accept_new_host_keys=True, forks=4) == 1
    remote = executor_connect(ready.host, settings, True)
    found = facts_mod.gather(remote, root=ready.settings.root, model_paths=[ready.services[0].service.model_path],
                             sudo=True)
    assert remote.round_trips == 1  # the probe sent ahead was the deploy's probe
    assert found.probe_version == 4 and found.releases_read
    assert early.take(ready.host, settings, True) is None  # taken once
    remote.close()


def test_early_is_skipped_past_one_batch_and_for_other_settings(sshd, tmp_path, settings):
    inv, ready = _prepared(sshd, tmp_path)
    assert early.start([ready], settings, accept_new_host_keys=True, forks=0) == 0
    assert early.take(ready.host, settings, True) is None
    early.start([ready], settings, accept_new_host_keys=True, forks=1)
    # opened with other settings (here: without accept-new): not this deploy's connection
    assert early.take(ready.host, settings, False) is None
    other = Settings.of({"ssh": {"known_hosts": str(tmp_path / "other-kh"), "connect_timeout": 3}})
    assert early.take(ready.host, other, True) is None
    early.close_all()  # closes what nobody took
    assert early.take(ready.host, settings, True) is None


def test_a_host_key_refusal_met_early_is_the_deploys_refusal(sshd, tmp_path, settings):
    inv, ready = _prepared(sshd, tmp_path)
    early.start([ready], settings, accept_new_host_keys=False, forks=1)  # unknown key, not accepted
    with pytest.raises(Refusal) as exc:
        executor_connect(ready.host, settings, False)
    assert "test-host" in exc.value.reason
    with pytest.raises(HostKeyError):
        connect(ready.host, config=settings.ssh, accept_new_host_keys=False)


# -- from the last run: remember / recall -----------------------------------------------------------


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache" / "llmfleet" / "early"


def test_a_deploy_recalls_the_last_runs_connection_and_probe_before_parsing_the_inventory(sshd, tmp_path, settings,
                                                                                             cache):
    inv, ready = _prepared(sshd, tmp_path)
    selection = ("test-host", None, None)
    assert early.recall(tmp_path / "hosts.yml", selection, settings, accept_new_host_keys=False, forks=5) == 0
    early.remember(tmp_path / "hosts.yml", selection, [ready], settings)
    (kept,) = cache.iterdir()
    assert kept.stat().st_mode & 0o777 == 0o600 and cache.stat().st_mode & 0o777 == 0o700
    # the next run: the connection opens and the probe goes out from the file alone
    with connect(ready.host, config=settings.ssh, accept_new_host_keys=True):  # the host key is known
        pass
    assert early.recall(tmp_path / "hosts.yml", selection, settings, accept_new_host_keys=False, forks=5) == 1
    assert early.start([ready], settings, accept_new_host_keys=False, forks=5) == 1  # the guess is kept
    remote = executor_connect(ready.host, settings, False)
    found = facts_mod.gather(remote, root=ready.settings.root, model_paths=[ready.services[0].service.model_path],
                             sudo=True)
    assert remote.round_trips == 1 and found.releases_read  # the recalled probe was the deploy's probe
    remote.close()


def test_nothing_is_recalled_after_the_inventory_changed_or_for_another_selection(sshd, tmp_path, settings, cache):
    inv, ready = _prepared(sshd, tmp_path)
    selection = ("test-host", None, None)
    early.remember(tmp_path / "hosts.yml", selection, [ready], settings)
    assert early.recall(tmp_path / "hosts.yml", ("test-host", None, "other"), settings, accept_new_host_keys=False,
                        forks=5) == 0
    assert early.recall(tmp_path / "hosts.yml", selection, settings, accept_new_host_keys=False, forks=0) == 0
    path = tmp_path / "hosts.yml"
    path.write_text(path.read_text() + "\n# edited\n")
    assert early.recall(path, selection, settings, accept_new_host_keys=False, forks=5) == 0


def test_a_guess_never_accepts_a_host_key_and_one_that_no_longer_fits_is_replaced(sshd, tmp_path, settings, cache):
    inv, ready = _prepared(sshd, tmp_path)
    selection = ("test-host", None, None)
    early.remember(tmp_path / "hosts.yml", selection, [ready], settings)
    # --accept-new-host-keys: no guess at all (it could record a key for a login the inventory no longer names)
    assert early.recall(tmp_path / "hosts.yml", selection, settings, accept_new_host_keys=True, forks=5) == 0
    # a guess with an unknown key fails quietly; the prepared host (here: other SSH settings) is connected anew
    assert early.recall(tmp_path / "hosts.yml", selection, settings, accept_new_host_keys=False, forks=5) == 1
    assert not settings.ssh.known_hosts_path.exists()
    other = Settings.of({"ssh": {"known_hosts": str(tmp_path / "kh"), "connect_timeout": 7}})
    assert early.start([ready], other, accept_new_host_keys=True, forks=5) == 1
    remote = executor_connect(ready.host, other, True)
    assert remote.run(["true"]).ok
    remote.close()


def test_the_file_holds_logins_and_paths_never_secrets(sshd, tmp_path, settings, cache, monkeypatch):
    monkeypatch.setenv("TEST_EARLY_KEY", "sk-do-not-store-me")
    inv, ready = _prepared(sshd, tmp_path)
    svc = ready.services[0]
    secret_ready = type(ready)(ready.inventory, ready.host, ready.settings,
                               (type(svc)(svc.service, "sk-do-not-store-me", svc.image),))
    early.remember(tmp_path / "hosts.yml", ("test-host", None, None), [secret_ready], settings)
    (kept,) = cache.iterdir()
    text = kept.read_text()
    assert "sk-do-not-store-me" not in text
    assert str(sshd.client_key) in text and svc.service.model_path in text


def test_an_executable_inventory_is_never_guessed(sshd, tmp_path, settings, cache):
    inv, ready = _prepared(sshd, tmp_path)
    script = tmp_path / "inventory.py"
    script.write_text("#!/bin/sh\necho '{}'\n")
    script.chmod(0o755)
    early.remember(script, ("test-host", None, None), [ready], settings)
    assert not cache.exists()
    assert early.recall(script, ("test-host", None, None), settings, accept_new_host_keys=False, forks=5) == 0


def test_only_the_latest_selections_are_kept(sshd, tmp_path, settings, cache, monkeypatch):
    inv, ready = _prepared(sshd, tmp_path)
    monkeypatch.setattr(early, "MAX_KEPT", 3)
    for n in range(5):
        selection = (f"host-{n}", None, None)
        early.remember(tmp_path / "hosts.yml", selection, [ready], settings)
        written = early._cache_file(early._sources(tmp_path / "hosts.yml"), selection)
        os.utime(written, ns=(n * 10**9, n * 10**9))  # one second apart, whatever the clock's grain
    assert len(list(cache.iterdir())) == 3
    assert early.recall(tmp_path / "hosts.yml", ("host-4", None, None), settings, accept_new_host_keys=False,
                        forks=5) == 1
    assert early.recall(tmp_path / "hosts.yml", ("host-0", None, None), settings, accept_new_host_keys=False,
                        forks=5) == 0
