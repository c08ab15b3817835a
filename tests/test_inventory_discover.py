"""Without -i the inventory is found as Ansible finds it: llmfleet.inventory, ANSIBLE_INVENTORY, the first
ansible.cfg's [defaults] inventory (ANSIBLE_CONFIG, ./ansible.cfg, ~/.ansible.cfg, /etc/ansible/ansible.cfg),
./inventory; else one line saying where it looked."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from llmfleet.errors import UsageError
from llmfleet.inventory.discover import ansible_cfg_paths, find

LLMFLEET = str(Path(sys.executable).parent / "llmfleet")


@pytest.fixture
def box(tmp_path):
    cwd, home = tmp_path / "work", tmp_path / "home"
    cwd.mkdir()
    home.mkdir()
    return cwd, home


def test_i_wins_then_the_setting(box):
    cwd, home = box
    (cwd / "inventory").mkdir()
    env = {"ANSIBLE_INVENTORY": str(cwd)}
    assert find(["a.yml", "b.yml"], "x", env, str(cwd), str(home)).sources == ["a.yml", "b.yml"]
    assert find(None, "fleet/", env, str(cwd), str(home)).origin == "llmfleet.inventory"


def test_ansible_inventory_env_before_ansible_cfg(box):
    cwd, home = box
    (cwd / "a.yml").write_text("all: {}\n")
    (cwd / "b").mkdir()
    (cwd / "ansible.cfg").write_text("[defaults]\ninventory = b\n")
    found = find(None, None, {"ANSIBLE_INVENTORY": "a.yml, ~/c.yml"}, str(cwd), str(home))
    assert found.sources == [str(cwd / "a.yml"), str(home / "c.yml")] and found.origin == "ANSIBLE_INVENTORY"


def test_ansible_cfg_in_ansibles_order_relative_to_the_file(box, tmp_path):
    cwd, home = box
    elsewhere = tmp_path / "etc"
    elsewhere.mkdir()
    (elsewhere / "fleet").mkdir()
    (elsewhere / "ansible.cfg").write_text("[defaults]\ninventory = fleet/ ; the production fleet\n")
    (cwd / "ansible.cfg").write_text("[defaults]\ninventory = here\n")
    (cwd / "here").mkdir()
    (home / ".ansible.cfg").write_text("[defaults]\ninventory = ~/inv\n")
    (home / "inv").mkdir()
    assert find(None, None, {"ANSIBLE_CONFIG": str(elsewhere / "ansible.cfg")}, str(cwd), str(home)).sources == [
        str(elsewhere / "fleet")]
    assert find(None, None, {}, str(cwd), str(home)).sources == [str(cwd / "here")]
    (cwd / "ansible.cfg").unlink()
    found = find(None, None, {}, str(cwd), str(home))
    assert found.sources == [str(home / "inv")] and found.origin == "~/.ansible.cfg [defaults] inventory"
    assert ansible_cfg_paths({}, "/w", "/h") == ["/w/ansible.cfg", "/h/.ansible.cfg", "/etc/ansible/ansible.cfg"]


def test_the_first_ansible_cfg_found_is_the_only_one_read(box):
    cwd, home = box
    (cwd / "ansible.cfg").write_text("[defaults]\nforks = 5\n")
    (home / ".ansible.cfg").write_text("[defaults]\ninventory = /srv/inv\n")
    (cwd / "inventory").mkdir()
    found = find(None, None, {}, str(cwd), str(home))
    assert found.origin == "./inventory"


def test_nothing_found_says_where_it_looked(box):
    cwd, home = box
    with pytest.raises(UsageError) as e:
        find(None, None, {}, str(cwd), str(home))
    msg = str(e.value)
    assert "\n" not in msg
    for where in ("-i", "ANSIBLE_INVENTORY", "./ansible.cfg", "~/.ansible.cfg", "/etc/ansible/ansible.cfg",
                  "./inventory"):
        assert where in msg


def test_a_named_inventory_that_is_missing_is_an_error(box):
    cwd, home = box
    with pytest.raises(UsageError, match=r"/nope \(from ANSIBLE_INVENTORY\) does not exist"):
        find(None, None, {"ANSIBLE_INVENTORY": "/nope"}, str(cwd), str(home))
    (cwd / "ansible.cfg").write_text("[defaults]\ninventory = gone/\n")
    with pytest.raises(UsageError, match=r"from ./ansible.cfg \[defaults\] inventory"):
        find(None, None, {}, str(cwd), str(home))


def run(cwd: Path, home: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([LLMFLEET, "inventory", "--list"], cwd=cwd, capture_output=True, text=True, timeout=60,
                          env={"PATH": os.environ.get("PATH", ""), "HOME": str(home), **env})


def test_the_cli_finds_it_as_ansible_does(box):
    cwd, home = box
    res = run(cwd, home)
    assert res.returncode == 2 and res.stderr.startswith("error: no inventory:") and len(res.stderr.splitlines()) == 1
    (cwd / "inventory").mkdir()
    (cwd / "inventory" / "hosts.yml").write_text("g:\n  hosts:\n    local-host:\n")
    assert "local-host" in run(cwd, home).stdout
    (cwd / "cfg.yml").write_text("g:\n  hosts:\n    cfg-host:\n")
    (cwd / "ansible.cfg").write_text("[defaults]\ninventory = cfg.yml\n")
    assert "cfg-host" in run(cwd, home).stdout
    (cwd / "env.yml").write_text("g:\n  hosts:\n    env-host:\n")
    assert "env-host" in run(cwd, home, ANSIBLE_INVENTORY="env.yml").stdout


@pytest.mark.parametrize(
    ("named", "says"),
    [
        (None, None),
        ("{cwd}/ansible.cfg", None),
        ("{cwd}", None),  # a folder: its ansible.cfg
        ("{cwd}/gone.cfg", "ANSIBLE_CONFIG names {cwd}/gone.cfg, which does not exist; passed over as Ansible does"),
        ("{home}", "ANSIBLE_CONFIG names {home}/ansible.cfg, which does not exist"),
    ],
)
def test_an_ansible_config_naming_no_file_is_said(box, named, says):
    from llmfleet.inventory.discover import missing_ansible_config

    cwd, home = box
    (cwd / "ansible.cfg").write_text("[defaults]\ninventory = here\n")
    env = {} if named is None else {"ANSIBLE_CONFIG": named.format(cwd=cwd, home=home)}
    got = missing_ansible_config(env)
    if says is None:
        assert got is None
    else:
        assert got is not None and got.startswith(says.format(cwd=cwd, home=home)) and "unset ANSIBLE_CONFIG" in got


def test_a_missing_ansible_config_is_passed_over_with_a_warning(box):
    from llmfleet.inventory.values import InventoryWarning

    cwd, home = box
    (cwd / "ansible.cfg").write_text("[defaults]\ninventory = here\n")
    (cwd / "here").mkdir()
    with pytest.warns(InventoryWarning, match=r"ANSIBLE_CONFIG names /nope/ansible.cfg, which does not exist"):
        found = find(None, None, {"ANSIBLE_CONFIG": "/nope/ansible.cfg"}, str(cwd), str(home))
    assert found.sources == [str(cwd / "here")]  # the next in Ansible's order, as Ansible reads it
