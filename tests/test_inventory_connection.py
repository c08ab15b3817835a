"""Connection settings from an inventory, as Ansible and OpenSSH would apply them.

- ``{{ }}`` in the variables llmfleet reads is resolved (Ansible templates them at connect time);
- ansible_ssh_common_args' ``-o``/``-J``/``-i``/``-p``/``-l`` act like ssh's command-line options;
- connection variables llmfleet ignores are warnings naming them;
- ~/.ssh/config is resolved as ``ssh -G`` resolves it (OpenSSH 9, the reference in every case below),
  ``Include`` and ``Match`` included.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from llmfleet.errors import InventoryError
from llmfleet.host import ssh_config
from llmfleet.host.ssh import Target, connect
from llmfleet.inventory.ansible import Host, load_inventory
from llmfleet.inventory.connection import connection_settings, connection_warnings

SSH = shutil.which("ssh")


def test_jinja_in_connection_vars_is_resolved(tmp_path: Path) -> None:
    (tmp_path / "hosts").write_text(
        "[gpu]\ngpu-1 ansible_host=\"{{ subnet }}.11\" ansible_port=\"{{ base_port + 1 }}\"\n"
        "[gpu:vars]\nsubnet=10.20.0\nbase_port=2200\nansible_user=\"{{ team }}-deploy\"\nteam=ml\n"
        "ansible_ssh_private_key_file=\"{{ inventory_dir }}/keys/{{ inventory_hostname }}\"\n"
    )
    t = Target.from_host(load_inventory(tmp_path / "hosts").hosts["gpu-1"])
    assert (t.address, t.port, t.user, t.key_file) == ("10.20.0.11", 2201, "ml-deploy", f"{tmp_path}/keys/gpu-1")


@pytest.mark.parametrize(
    ("hostvars", "message"),
    [
        ({"ansible_host": "{{ missing_var }}.lan"}, r"ansible_host: 'missing_var' is undefined"),
        ({"ansible_host": "{{ a }}", "a": "{{ b }}", "b": "{{ a }}"}, r"ansible_host: variables refer to each other in a loop \(a -> b -> a\)"),
        ({"ansible_host": "{{ x | no_such_filter }}", "x": 1}, r"ansible_host: cannot render"),
        ({"ansible_connection": "docker"}, r"ansible_connection=docker: llmfleet reaches hosts over SSH only"),
        ({"ansible_become_method": "su"}, r"only sudo is supported"),
    ],
)
def test_unresolvable_connection_vars_are_one_error_naming_the_variable(hostvars, message) -> None:
    with pytest.raises(InventoryError, match=message) as err:
        connection_settings(Host(name="h", vars=hostvars))
    assert "\n" not in str(err.value)


def test_ssh_common_args_are_applied_like_ssh_command_line_options() -> None:
    cs = connection_settings(Host(name="h", vars={
        "ansible_ssh_common_args": "-o ProxyJump=bastion -oStrictHostKeyChecking=no -J ignored-second -i /k/a -A",
        "ansible_ssh_extra_args": "-o 'ServerAliveInterval 30' -p 2200",
    }))
    assert cs.ssh_options["proxyjump"] == ["bastion"]
    assert cs.ssh_options["identityfile"] == ["/k/a"]
    assert cs.ssh_options["port"] == ["2200"] and "serveraliveinterval" not in cs.ssh_options
    assert cs.ignored_args == ("-o StrictHostKeyChecking=no", "-A", "-o ServerAliveInterval 30")


def test_ignored_connection_vars_are_warnings() -> None:
    host = Host(name="h", vars={"ansible_become_password": "x", "ansible_ssh_pipelining": True,
                                "ansible_ssh_common_args": "-A -o ProxyJump=b", "ansible_python_interpreter": "/usr/bin/python3",
                                "ansible_user": "u"},
                sources={"ansible_become_password": "inv/host_vars/h.yml"})
    w = connection_warnings(host)
    assert any(x.startswith("inv/host_vars/h.yml: host h: ansible_become_password is ignored") for x in w)
    assert any("ansible_ssh_pipelining is ignored" for x in w)
    assert any("ansible_ssh_common_args: -A ignored" in x for x in w)
    assert not any("python_interpreter" in x or "ansible_user" in x for x in w)


# --- OpenSSH config: ssh -G is the reference ----------------------------------------------------------

CONFIG = """
Host gw
  HostName 10.1.1.1
  User jumper
Host alias2
  HostName %h.internal.example
  Port=2201
  IdentityFile /keys/%h-%r-%p
  IdentityFile "/keys/with space"
Include {inc}/*.conf
Match originalhost alias2
  User deploy
  ProxyJump gw
Match host *.internal.example !originalhost alias9
  ProxyCommand ssh -W %h:%p gw
Host alias3
  Include {inc}/conditional/*.conf
Match final host *.example
  IdentityFile /keys/final-%n
Match user deploy
  ForwardAgent yes
Match exec "test %h = alias5"
  User execuser
Match localuser no-such-local-user
  Port 9
Match !localuser no-such-local-user originalhost alias5
  Port 5555
Host *.example !nomatch.example
  Port 2299
Host *
  IdentityFile /keys/default
  ServerAliveInterval 15
"""
INC = "Host alias4\n  HostName four.example\n  User four\nMatch host four.example\n  Port 4444\n"
COND = "HostName three.example\nMatch all\n  User three\n"


@pytest.fixture
def config(tmp_path: Path) -> Path:
    (tmp_path / "inc" / "conditional").mkdir(parents=True)
    (tmp_path / "inc" / "a.conf").write_text(INC)
    (tmp_path / "inc" / "conditional" / "c.conf").write_text(COND)
    cfg = tmp_path / "config"
    cfg.write_text(CONFIG.format(inc=tmp_path / "inc"))
    return cfg


def ssh_g(cfg: Path, host: str, *opts: str) -> dict[str, list[str]]:
    out = subprocess.run([SSH, "-G", "-F", str(cfg), *opts, host], capture_output=True, text=True, check=True,
                         timeout=30, stdin=subprocess.DEVNULL).stdout
    ref: dict[str, list[str]] = {}
    for line in out.splitlines():
        k, _, v = line.partition(" ")
        ref.setdefault(k, []).append(v)
    return ref


KEYS = ("hostname", "user", "port", "identityfile", "proxyjump", "proxycommand", "forwardagent", "serveraliveinterval")


@pytest.mark.skipif(SSH is None, reason="the OpenSSH client (ssh -G) is the reference and is not installed")
@pytest.mark.parametrize(
    ("host", "opts"),
    [("alias2", ()), ("ALIAS2", ()), ("alias5", ()), ("alias3", ()), ("alias4", ()), ("other", ()), ("gw", ()),
     ("x.example", ()), ("nomatch.example", ()), ("alias2", ("-o", "User=root", "-p", "2")),
     ("alias4", ("-o", "User=deploy", "-o", "IdentityFile=/keys/cli"))],
)
def test_resolution_matches_ssh_dash_G(config: Path, host: str, opts: tuple[str, ...]) -> None:
    cmdline: dict[str, list[str]] = {}
    it = iter(opts)
    for flag in it:
        val = next(it)
        if flag == "-o":
            k, v = val.split("=", 1)
            cmdline[k.lower()] = [v]
        else:
            cmdline[{"-p": "port", "-i": "identityfile"}[flag]] = [val]
    mine = ssh_config.resolve(host, config_file=str(config), options=cmdline)
    ref = ssh_g(config, host, *opts)
    for key in KEYS:
        got = mine.options.get(key)
        if got is None and key in ("user", "port", "identityfile", "forwardagent", "serveraliveinterval"):
            # not set by any file: ssh -G prints its built-in default
            continue
        assert got == ref.get(key), (host, key)


def test_tokens_are_expanded_when_used(config: Path) -> None:
    r = ssh_config.resolve("alias2", config_file=str(config), local_user="me")
    assert r.expanded("identityfile")[0] == "/keys/alias2.internal.example-deploy-2201"
    assert r.expanded("proxycommand") == [] and r.get("proxyjump") == "gw"


def test_connect_uses_the_resolved_config(sshd, tmp_path: Path) -> None:
    """Host alias only in an Include'd file behind a Match: the connection follows it."""
    inc = tmp_path / "conf.d"
    inc.mkdir()
    (inc / "gpu.conf").write_text(f"Host gpu-inc-01\n  HostName 127.0.0.1\nMatch host 127.0.0.1\n  Port {sshd.port}\n"
                                  f"  User root\n  IdentityFile {sshd.client_key}\n")
    cfg = tmp_path / "ssh_config"
    cfg.write_text(f"Include {inc}/*.conf\n")
    with connect(Host(name="gpu-inc-01", vars={}), config={"known_hosts": str(tmp_path / "kh"), "config_file": str(cfg)},
                 accept_new_host_keys=True) as r:
        assert r.run(["whoami"]).stdout == "root\n"
