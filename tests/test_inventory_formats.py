"""Every inventory format Ansible reads, checked against ``ansible-inventory`` (ansible-core, the dev
extra) as the oracle: INI (its value typing included), TOML, host lists, several ``-i`` merged in
order, folders with extension-less files and Ansible's ignore list, executable scripts, and the
``constructed`` plugin. The rules are ansible-core's inventory plugins (ini.py, toml.py, script.py,
host_list.py, constructed.py) and InventoryManager.parse_source."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from llmfleet.errors import InventoryError
from llmfleet.inventory.ansible import load_inventory
from llmfleet.inventory.ini import parse_value
from llmfleet.inventory.values import UnsafeText

ANSIBLE_INVENTORY = shutil.which("ansible-inventory") or str(Path(sys.executable).parent / "ansible-inventory")


def write_tree(root: Path, files: dict[str, str], executable: tuple[str, ...] = ()) -> Path:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text).lstrip("\n"))
        if rel in executable:
            p.chmod(0o755)
    return root


def oracle(cwd: Path, sources: list[str], *args: str, env: dict[str, str] | None = None) -> dict:
    cmd = [ANSIBLE_INVENTORY]
    for s in sources:
        cmd += ["-i", s]
    out = subprocess.run(
        [*cmd, *args], capture_output=True, text=True, check=True, timeout=120, cwd=cwd,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "ANSIBLE_LOCAL_TEMP": str(cwd / ".ansible-tmp"),
             "HOME": str(cwd), **(env or {})},
    )
    return json.loads(out.stdout)


def plain(doc):
    return json.loads(json.dumps(doc))


def same_as_ansible(cwd: Path, sources: list[str], env: dict[str, str] | None = None):
    inv = load_inventory(sources, cwd=cwd)
    assert plain(inv.to_ansible_list()) == oracle(cwd, sources, "--list", env=env)
    for name in list(inv.hosts)[:6]:
        assert plain(inv.host_json(name)) == oracle(cwd, sources, "--host", name, env=env), name
    return inv


INI = """
    # a comment; hosts before any section are ungrouped
    loose.example.com ansible_port=2222
    [web]
    web[01:03].example.com http_port=80 maxRequestsPerChild=808 tags="['a', 'b']"
    db-a.example.com:2201 flag=True ratio=0.5 none=None nested="{'k': [1, 2]}" word=yes # trailing comment
    [web:vars]
    ntp_server=ntp.example.com
    count=3
    listy=[1, 2, 3]
    quoted="spaced value"
    comment_kept=value # not a comment in :vars
    [gpus:children]
    web
    later
    [later]
    gpu-[a:c] ansible_host=10.0.0.1
    [later:vars]
    ansible_group_priority=5
    shared=later
    [gpus:vars]
    shared=gpus
    [all:vars]
    shared=all
    tupled=(1, 2)
    setty={3}
    byte=b'raw'
    """


def test_ini_resolves_as_ansible(tmp_path: Path) -> None:
    write_tree(tmp_path, {
        "inv/hosts": INI,
        "inv/group_vars/web.yml": "from_group_vars: web\nshared: web-file\n",
        "inv/group_vars/all": "from_group_vars: all\n",
        "inv/host_vars/gpu-b": "from_host_vars: yes\n",
    })
    inv = same_as_ansible(tmp_path, ["inv/hosts"])
    h = inv.hosts["db-a.example.com"].vars
    assert (h["ansible_port"], h["flag"], h["ratio"], h["none"], h["word"]) == (2201, True, 0.5, None, "yes")
    assert inv.hosts["web01.example.com"].vars["count"] == 3  # [g:vars] values are typed too (ansible-core 2.19)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("True", True), ("1", 1), ("1.5", 1.5), ("'quoted'", "quoted"), ("[1, (2, 3)]", [1, [2, 3]]),
        ("{'a': {1}}", {"a": [1]}), ("None", None), ("...", "..."), ("1j", "1j"), ("set()", []),
        ("yes", "yes"), ("host-01.internal", "host-01.internal"), ("{{ x }}", "{{ x }}"),
    ],
)
def test_ini_value_typing(text, value) -> None:
    # ansible-core's ini plugin: ast.literal_eval, else the text; tuples/sets -> lists, ... and complex -> str
    assert parse_value(text) == value


def test_ini_bytes_are_unsafe_strings() -> None:
    v = parse_value("b'x'")
    assert isinstance(v, UnsafeText) and v == "x"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[web:vars]\nx=1\n", r"hosts:1: section \[web:vars\] is for group 'web', which is not defined"),
        ("[a:children]\nnope\n", r"hosts:2: section \[a:children\] names group 'nope', which is not defined"),
        ("[web]\nh1 novalue\n", r"hosts:2: expected key=value host variable assignment, got 'novalue'"),
        ("[web:weird]\n", r"hosts:1: section \[web:weird\] has unknown type 'weird'"),
        ("[web]\nh[01:4]\n", r"hosts:2: host range must specify equal-length"),
    ],
)
def test_ini_errors_name_file_and_line(tmp_path: Path, text, message) -> None:
    write_tree(tmp_path, {"hosts": text})
    with pytest.raises(InventoryError, match=message):
        load_inventory(tmp_path / "hosts")


def test_toml_resolves_as_ansible(tmp_path: Path) -> None:
    write_tree(tmp_path, {"inv.toml": """
        [all.vars]
        has_java = false
        [web]
        children = ["apache", "nginx"]
        vars = { http_port = 8080, myvar = 23 }
        [web.hosts]
        host1 = {}
        "host2:2222" = { x = "a#b" }
        [apache.hosts]
        "tomcat[1:3]" = { mysecret = "03#pa33w0rd" }
        [nginx.hosts]
        jenkins1 = {}
        """})
    same_as_ansible(tmp_path, ["inv.toml"])


def test_host_list_resolves_as_ansible(tmp_path: Path) -> None:
    inv = same_as_ansible(tmp_path, ["10.0.0.5, web.example.com:2222,db,"])
    assert inv.hosts["web.example.com"].vars["ansible_port"] == 2222


def test_several_sources_merge_in_order(tmp_path: Path) -> None:
    write_tree(tmp_path, {
        "a/hosts.yml": "all:\n  vars: {who: a}\n  children:\n    web:\n      hosts:\n        h1: {x: a}\n        h2:\n",
        "a/group_vars/web.yml": "gv: from-a\nonly_a: 1\n",
        "a/group_vars/all.yml": "allv: a\n",
        "b/hosts": "[web]\nh1 x=b\nh3\n[db]\nh2\n[all:vars]\nwho=b\n",
        "b/group_vars/web": "gv: from-b\n",
        "b/group_vars/all.yml": "allv: b\n",
        "b/host_vars/h1.yml": "hv: b\n",
        "c/extra.yml": "db:\n  hosts:\n    h4:\n",
    })
    inv = same_as_ansible(tmp_path, ["a/hosts.yml", "b/hosts", "c", "h5,"])
    assert inv.hosts["h1"].vars["gv"] == "from-b" and inv.hosts["h1"].vars["x"] == "b"


def test_folder_reads_what_ansible_reads(tmp_path: Path) -> None:
    write_tree(tmp_path, {
        "inv/01-hosts": "[web]\nw1\n",
        "inv/02-more.yaml": "web:\n  hosts:\n    w2:\n",
        "inv/03-yaml-no-ext": "db:\n  hosts:\n    d1: {engine: pg}\n",
        "inv/README.md": "# not an inventory\n",
        "inv/notes.txt": "x y z\n",
        "inv/old.bak": "[old]\nstale\n",
        "inv/hosts~": "[old]\nstale2\n",
        "inv/ansible.cfg": "[defaults]\n",
        "inv/.hidden": "[old]\nhidden\n",
        "inv/sub/04-nested.ini": "[nested]\nn1\n",
        "inv/group_vars/web.yml": "g: 1\n",
    })
    inv = same_as_ansible(tmp_path, ["inv"])
    assert {"w1", "w2", "d1", "n1"} == set(inv.hosts)


def test_folder_ignore_list_follows_ansible_settings(tmp_path: Path) -> None:
    write_tree(tmp_path, {"inv/a.yml": "web:\n  hosts:\n    w1:\n", "inv/b.skip": "[x]\nskipped\n",
                          "inv/c.keep": "[y]\nkept\n", "inv/generated-1": "[z]\ngen\n"})
    env = {"ANSIBLE_INVENTORY_IGNORE": ".skip", "ANSIBLE_INVENTORY_IGNORE_REGEX": "^generated-"}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        inv = same_as_ansible(tmp_path, ["inv"], env=env)
    finally:
        for k, v in old.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
    assert set(inv.hosts) == {"w1", "kept"}


def test_unparseable_file_in_a_folder_is_skipped_with_a_warning(tmp_path: Path) -> None:
    write_tree(tmp_path, {"inv/hosts": "[web]\nw1\n", "inv/LICENSE": "MIT License\n\nCopyright holder\n"})
    inv = load_inventory(tmp_path / "inv")
    assert set(inv.hosts) == {"w1"}
    assert any("LICENSE: skipped" in w for w in inv.warnings)


def test_unparseable_named_source_is_an_error(tmp_path: Path) -> None:
    write_tree(tmp_path, {"LICENSE": "MIT License\n"})
    with pytest.raises(InventoryError, match=r"LICENSE: not an inventory: .*LICENSE:1: expected key=value"):
        load_inventory(tmp_path / "LICENSE")


SCRIPT = """
    #!/usr/bin/env python3
    import json, sys
    if sys.argv[1] == "--list":
        print(json.dumps({
            "web": {"hosts": ["w1", "w2"], "vars": {"port": 80}, "children": ["edge"]},
            "edge": ["e1"],
            "solo": {"answer": 42},
            "_meta": {"hostvars": {"w1": {"ansible_host": "10.0.0.1", "secret": {"__ansible_unsafe": "{{ raw }}"}}}},
        }))
    """

SCRIPT_NO_META = """
    #!/bin/sh
    if [ "$1" = "--list" ]; then echo '{"web": {"hosts": ["w1", "w2"]}}'; else echo "{\\"me\\": \\"$2\\"}"; fi
    """


@pytest.mark.parametrize("text", [SCRIPT, SCRIPT_NO_META], ids=["meta", "per-host"])
def test_executable_inventory_is_run_as_ansible_runs_it(tmp_path: Path, text: str) -> None:
    write_tree(tmp_path, {"inv.py": text, "group_vars/web.yml": "from_file: 1\n"}, executable=("inv.py",))
    same_as_ansible(tmp_path, ["inv.py"])


def test_failing_script_is_one_error(tmp_path: Path) -> None:
    write_tree(tmp_path, {"inv.sh": "#!/bin/sh\necho 'no cloud credentials' >&2\nexit 3\n"}, executable=("inv.sh",))
    with pytest.raises(InventoryError, match=r"inv.sh --list: exited 3: no cloud credentials"):
        load_inventory(tmp_path / "inv.sh")


def test_constructed_plugin_groups_and_compose(tmp_path: Path) -> None:
    write_tree(tmp_path, {
        "static.yml": """
            all:
              vars: {site: ams}
              hosts:
                g1: {gpu: v100, count: 4, tags: {tier: gold}}
                g2: {gpu: t4, count: 1}
                g3: {gpu: v100, count: 8}
            """,
        "constructed.yml": """
            plugin: ansible.builtin.constructed
            compose:
              big: count > 2
              label: gpu ~ '-' ~ site
            groups:
              multi_gpu: count > 2
              broken: undefined_var > 1
            keyed_groups:
              - key: gpu
                prefix: card
              - key: tags
                separator: '-'
              - key: site
                parent_group: sites
            """,
    })
    same_as_ansible(tmp_path, ["static.yml", "constructed.yml"])


def test_path_with_commas_is_a_path_when_it_exists(tmp_path: Path) -> None:
    # ansible-core 2.19.14 fails on this (see shared realinv case 24); an existing path is a path.
    write_tree(tmp_path, {"this,path,has,commas/hosts": "[web]\nw1\n", "this,path,has,commas/group_vars/all.yml": "a: 1\n"})
    inv = load_inventory(["this,path,has,commas/hosts"], cwd=tmp_path)
    assert inv.hosts["w1"].vars == {"a": 1}


def test_a_dictionary_set_twice_is_replaced_not_merged(tmp_path: Path) -> None:
    # Host.set_variable -> combine_vars(..., hash_behaviour=replace): the later dictionary wins whole.
    write_tree(tmp_path, {"h.yml": "all:\n  hosts:\n    a: {d: {x: 1, y: 2}}\n  children:\n    g:\n      hosts:\n        a: {d: {z: 3}}\n"})
    inv = same_as_ansible(tmp_path, ["h.yml"])
    assert inv.hosts["a"].vars["d"] == {"z": 3}


def test_other_inventory_plugins_run_through_ansible_inventory(tmp_path: Path) -> None:
    # ansible.builtin.generator needs Ansible itself: its --list output is ingested like a script's
    write_tree(tmp_path, {"gen.yml": """
        plugin: ansible.builtin.generator
        hosts:
          name: "{{ operation }}-{{ application }}"
        layers:
          operation: [build, launch]
          application: [web, api]
        """})
    same_as_ansible(tmp_path, ["gen.yml"])


def test_a_script_that_never_answers_is_killed_at_its_time_limit_and_named(tmp_path: Path) -> None:
    # the shell's child (sleep) holds the output pipe: it is killed with the script, or the wait never ends
    write_tree(tmp_path, {"inv/cloud.sh": "#!/bin/sh\nsleep 1000\n", "inv/hosts.ini": "[web]\nw1\n"},
               executable=("inv/cloud.sh",))
    with pytest.raises(InventoryError, match=r"inv/cloud.sh --list: no answer within 1 s, killed; give a slow "
                                             r"inventory script longer with llmfleet.inventory_timeout"):
        load_inventory(tmp_path / "inv", script_timeout=1)


def test_a_script_reads_nothing_from_stdin(tmp_path: Path) -> None:
    script = """
        #!/bin/sh
        read line  # a script that asks: it gets end-of-input at once, not the terminal
        echo '{"web": {"hosts": ["w1"]}, "_meta": {"hostvars": {}}}'
        """
    write_tree(tmp_path, {"inv.sh": script}, executable=("inv.sh",))
    assert list(load_inventory(tmp_path / "inv.sh", script_timeout=30).hosts) == ["w1"]


@pytest.mark.parametrize(
    ("files", "executable", "says"),
    [
        # an executable in a folder runs as a script (as Ansible runs it); one that fails stops the load
        ({"inv/a-tool": "#!/bin/sh\necho usage: a-tool >&2\nexit 2\n", "inv/hosts.ini": "[web]\nw1\n"},
         ("inv/a-tool",), r"inv/a-tool --list: exited 2: usage: a-tool \(an executable in a folder source is run as "
                          r"an inventory script, as Ansible does\)"),
        ({"inv/quiet": "#!/bin/sh\nexit 0\n"}, ("inv/quiet",),
         r"inv/quiet --list: printed nothing; an inventory script prints its groups as JSON"),
        ({"inv/chatty": "#!/bin/sh\necho hello\n"}, ("inv/chatty",), r"inv/chatty --list: output is not JSON"),
    ],
)
def test_a_failing_script_in_a_folder_stops_the_load_with_its_line(tmp_path: Path, files, executable, says) -> None:
    write_tree(tmp_path, files, executable=executable)
    with pytest.raises(InventoryError, match=says):
        load_inventory(tmp_path / "inv")


def test_an_executable_that_cannot_start_is_read_as_a_file_as_ansible_does(tmp_path: Path) -> None:
    # an INI file with the executable bit (a Windows share): no #! line, so not a script; Ansible's ini reads it
    write_tree(tmp_path, {"inv/hosts": "[web]\nw1\n"}, executable=("inv/hosts",))
    same_as_ansible(tmp_path, ["inv"])


def test_an_unreadable_executable_is_not_run(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        pytest.skip("root reads every file")
    write_tree(tmp_path, {"inv/x": "#!/bin/sh\ntouch ran\n", "inv/hosts.ini": "[web]\nw1\n"})
    (tmp_path / "inv" / "x").chmod(0o111)
    inv = load_inventory(tmp_path / "inv", cwd=tmp_path)
    assert list(inv.hosts) == ["w1"] and not (tmp_path / "ran").exists()


def test_a_folder_reached_twice_through_a_link_is_read_once(tmp_path: Path) -> None:
    write_tree(tmp_path, {"inv/hosts.ini": "[web]\nw1\n"})
    (tmp_path / "inv" / "loop").symlink_to(tmp_path / "inv")
    assert list(load_inventory(tmp_path / "inv").hosts) == ["w1"]
