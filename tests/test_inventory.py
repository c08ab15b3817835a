"""Inventory resolution, checked against ansible-core's ansible-inventory as the oracle."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from llmfleet.errors import InventoryError, UsageError
from llmfleet.inventory.ansible import expand_host_pattern, load_inventory

ANSIBLE_INVENTORY = shutil.which("ansible-inventory") or str(Path(sys.executable).parent / "ansible-inventory")


def write_tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text))
    return root


def oracle(path: Path, *args: str) -> dict:
    out = subprocess.run(
        [ANSIBLE_INVENTORY, "-i", str(path), *args],
        capture_output=True, text=True, check=True, timeout=120,
        env={"PATH": "/usr/bin:/bin", "ANSIBLE_LOCAL_TEMP": str(path.parent / ".ansible-tmp"),
             "HOME": str(path.parent), "ANSIBLE_INVENTORY_UNPARSED_WARNING": "False"},
    )
    return json.loads(out.stdout)


CASES = {
    "nested-children-ranges-priorities": {
        "hosts.yml": """
            all:
              vars: {shared: all-inline, d: {a: 1, b: 2}, level: all}
              hosts:
                lonely: {x: 1}
              children:
                gpus:
                  vars: {shared: gpus-inline, level: gpus}
                  children:
                    v100:
                      vars: {level: v100, ansible_group_priority: 5}
                      hosts:
                        gpu-v100-[01:04]:
                          ansible_host: 10.0.0.1
                        gpu-v100-9:2222:
                    rtx:
                      vars: {level: rtx, ansible_group_priority: 1}
                      hosts:
                        gpu-4090-[a:c]:
                dc1:
                  vars: {level: dc1}
                  hosts:
                    gpu-v100-01: {d: {c: 3}}
                    gpu-4090-a:
            """,
        "extra.yaml": """
            dc2:
              vars: {level: dc2}
              hosts:
                gpu-v100-0[2:3]:
            ungrouped:
              hosts:
                gpu-4090-b:
                solo:
            """,
        "group_vars/all.yml": "shared: all-file\nfilev: all\n",
        "group_vars/v100/a.yml": "filev: v100-folder-a\n",
        "group_vars/v100/b.yaml": "filev2: v100-folder-b\n",
        "group_vars/v100/sub/c": "filev3: v100-noext-in-subfolder\n",
        "group_vars/gpus.json": '{"filev": "gpus-json", "d": {"z": 9}}',
        "group_vars/dc1.yml": "filev: dc1-file\nlevel: dc1-file\n",
        "host_vars/gpu-v100-03.yml": "x: 2\nlevel: host-file\n",
        "host_vars/gpu-v100-02/main.yml": "x: 3\n",
    },
    # Same depth: priority decides before name; inline group vars always lose to group_vars files.
    "priority-beats-name-and-files-beat-inline": {
        "inv.yml": """
            all:
              children:
                aaa:
                  vars: {who: aaa, ansible_group_priority: 10}
                  hosts: {h1: , h2: }
                zzz:
                  vars: {who: zzz, inline_only: zzz}
                  hosts: {h1: , h3: }
            """,
        "group_vars/zzz.yml": "who: zzz-file\n",
        "group_vars/aaa.yml": "inline_only: aaa-file\n",
    },
    # A deeper group wins over a shallower one even when the name sorts first; dicts are replaced.
    "depth-beats-priority-dict-replaced": {
        "inv.yaml": """
            top:
              vars: {opts: {a: 1, b: 2}, who: top, ansible_group_priority: 99}
              children:
                mid:
                  children:
                    aleaf:
                      vars: {opts: {c: 3}, who: aleaf}
                      hosts:
                        node[1:3:2]:
                other:
                  hosts:
                    node1: {who: host-inline}
            """,
        "host_vars/node3.json": '{"opts": {"z": 26}}',
    },
    "single-file-and-empty-groups": {
        "only.yml": """
            all:
              hosts:
                a.example.com:
                  ansible_port: 2200
              children:
                empty:
                web:
                  hosts:
                    w[08:11]:
            """,
    },
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_list_matches_ansible_inventory(tmp_path: Path, name: str) -> None:
    inv = write_tree(tmp_path / "inv", CASES[name])
    expected = oracle(inv, "--list")
    got = load_inventory(inv).to_ansible_list()
    assert got == expected


@pytest.mark.parametrize("name", sorted(CASES))
def test_host_vars_match_ansible_inventory(tmp_path: Path, name: str) -> None:
    inv = write_tree(tmp_path / "inv", CASES[name])
    ours = load_inventory(inv)
    for host in list(ours.hosts)[:4]:
        assert ours.hosts[host].vars == oracle(inv, "--host", host), host


def test_single_file_inventory_reads_vars_beside_it(tmp_path: Path) -> None:
    inv = write_tree(tmp_path / "inv", {
        "hosts.yml": "g:\n  hosts:\n    h1:\n",
        "group_vars/g.yml": "from_file: yes\n",
    })
    assert load_inventory(inv / "hosts.yml").hosts["h1"].vars == oracle(inv / "hosts.yml", "--host", "h1")


@pytest.mark.parametrize(
    ("pattern", "expected"),
    [
        ("gpu-v100-[01:04]", ["gpu-v100-01", "gpu-v100-02", "gpu-v100-03", "gpu-v100-04"]),
        ("node-[a:c]", ["node-a", "node-b", "node-c"]),
        ("x[1:10:4]", ["x1", "x5", "x9"]),
        ("r[1:2]-[a:b]", ["r1-a", "r1-b", "r2-a", "r2-b"]),
        ("plain", ["plain"]),
        ("w[:2]", ["w0", "w1", "w2"]),
    ],
)
def test_host_ranges(pattern: str, expected: list[str]) -> None:
    assert expand_host_pattern(pattern) == expected


@pytest.mark.parametrize("pattern", ["h[01:4]", "h[1:]", "h[1:2:3:4]", "h[c:a]"])
def test_bad_host_ranges(pattern: str) -> None:
    with pytest.raises(ValueError):
        expand_host_pattern(pattern)


def test_source_of_each_variable_is_tracked(tmp_path: Path) -> None:
    inv = load_inventory(write_tree(tmp_path / "inv", CASES["nested-children-ranges-priorities"]))
    src = inv.hosts["gpu-v100-03"].sources
    assert src["level"].endswith("host_vars/gpu-v100-03.yml")
    assert src["filev"].endswith("group_vars/v100/a.yml")
    assert "extra.yaml" not in src["shared"] and src["shared"].endswith("group_vars/all.yml")


@pytest.mark.parametrize(
    ("host", "group", "expected"),
    [
        ("gpu-v100-*", None, ["gpu-v100-02", "gpu-v100-03", "gpu-v100-01", "gpu-v100-04", "gpu-v100-9"]),
        (None, "rtx", ["gpu-4090-b", "gpu-4090-a", "gpu-4090-c"]),
        (None, "gpus:!dc1", ["gpu-v100-02", "gpu-v100-03", "gpu-4090-b", "gpu-v100-04", "gpu-v100-9", "gpu-4090-c"]),
        (None, "v100:&dc2", ["gpu-v100-02", "gpu-v100-03"]),
        ("~gpu-v100-0[13]", None, ["gpu-v100-03", "gpu-v100-01"]),
        ("lonely,solo", None, ["solo", "lonely"]),
        ("gpu-*", "dc1", ["gpu-v100-01", "gpu-4090-a"]),
    ],
)
def test_select_patterns(tmp_path: Path, host, group, expected) -> None:
    inv = load_inventory(write_tree(tmp_path / "inv", CASES["nested-children-ranges-priorities"]))
    assert [h.name for h in inv.select(host=host, group=group)] == expected


def test_select_nothing_is_a_usage_error(tmp_path: Path) -> None:
    inv = load_inventory(write_tree(tmp_path / "inv", CASES["single-file-and-empty-groups"]))
    with pytest.raises(UsageError, match=r"matches no host; hosts: a.example.com, w08, w09, w10, w11; groups: ungrouped, empty, web"):
        inv.select(host="nope-*")


@pytest.mark.parametrize(
    ("files", "message"),
    [
        ({"h.yml": "all:\n  hosts:\n    a: [1\n"}, r"h.yml:\d+: malformed YAML"),
        ({"h.yml": "- a\n- b\n"}, r"h.yml: an inventory must be a mapping of groups"),
        ({"h.yml": "all:\n  hosts: [a, b]\n"}, r"h.yml: group 'all': 'hosts' must be a mapping, got list"),
        ({"h.yml": "g:\n  hosts:\n    a[01:4]:\n"}, r"h.yml: group 'g': host range must specify equal-length"),
        ({"h.yml": "g:\n  hosts:\n    a:\n", "group_vars/g.yml": "x: [\n"}, r"group_vars/g.yml:\d+: malformed YAML"),
        ({"h.yml": "g:\n  hosts:\n    a:\n", "host_vars/a.yml": "- 1\n"}, r"host_vars/a.yml: variables file must hold a mapping"),
        ({"h.yml": "a:\n  children:\n    b:\n      children:\n        a:\n"}, r"h.yml: group 'b' cannot be a child of 'a': that makes a loop"),
        ({"notes.txt": "x"}, r"no inventory file"),
    ],
)
def test_malformed_inventories_name_the_file(tmp_path: Path, files, message) -> None:
    with pytest.raises(InventoryError, match=message):
        load_inventory(write_tree(tmp_path / "inv", files))


BOMB = "all:\n  vars:\n    a: &a [" + ",".join(['"lol"'] * 9) + "]\n" + "".join(
    f"    {c}: &{c} [" + ",".join([f"*{prev}"] * 9) + "]\n" for prev, c in zip("abcdefgh", "bcdefghi", strict=True))


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        # nine anchors of nine aliases: 9^9 values once expanded; refused at the first anchor over the bound
        ("bomb.yml", BOMB, r"bomb\.yml:8: YAML aliases under all\.vars\.f expand to 597,871 values .*alias bomb"),
        ("loop.yml", "all:\n  vars:\n    a: &x [1, *x]\n", r"loop\.yml:3: YAML alias under all\.vars\.a\[1\] .*recursive"),
        ("deep.yml", "all:\n  vars:\n    a: " + "[" * 3000 + "]" * 3000 + "\n",
         # libyaml's parser stops at its depth limit, the pure-Python one at the interpreter's recursion limit
         r"deep\.yml(:3: malformed YAML: exceeded maximum nesting depth|: YAML nested too deeply)"),
    ],
)
def test_hostile_yaml_is_refused_in_one_line(tmp_path, name, text, message):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(InventoryError, match=message) as err:
        load_inventory(str(path))
    assert "\n" not in str(err.value)


def test_yaml_aliases_for_shared_blocks_still_load(tmp_path):
    path = tmp_path / "hosts.yml"
    path.write_text("all:\n  vars:\n    base: &b {x: 1, l: [1, 2]}\n  hosts:\n    h1: {<<: *b, y: 2}\n    h2:\n      copy: *b\n")
    inv = load_inventory(str(path))
    assert inv.hosts["h1"].vars["x"] == 1 and inv.hosts["h1"].vars["y"] == 2
    assert inv.hosts["h2"].vars["copy"] == {"x": 1, "l": [1, 2]}


def test_alias_expansion_bound_counts_every_use():
    import yaml as y

    from llmfleet.inventory.ansible import AliasBombError, check_alias_expansion

    node = y.compose("a: &a [1, 2, 3]\nb: [*a, *a, *a]\n")
    # mapping 1 + keys 2 + a (1 + 3) + b (1 + 3 x 4): 20, of which 8 nodes are written out, 12 added by aliases
    assert check_alias_expansion(node) == 1 + 2 + 4 + 13
    with pytest.raises(AliasBombError):
        check_alias_expansion(node, limit=11)
    assert check_alias_expansion(node, limit=12) == 20
