"""Package sources as inventory data (``llmfleet_apt_sources``): validated with one-line errors, written as
deb822 files with Signed-By the key provisioning copies, read by the facts, and the keys read from the
inventory folder before any host is contacted."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from llmfleet.errors import InventoryError, UsageError
from llmfleet.inventory.ansible import Host
from llmfleet.inventory.services import HostSettings
from llmfleet.provision import desired as D
from llmfleet.provision import steps as S
from tests.test_provision_steps import SETTINGS, bare

KEY = "-----BEGIN PGP PUBLIC KEY BLOCK-----\n\nmDMEZ...\n-----END PGP PUBLIC KEY BLOCK-----\n"
MIRROR = {"name": "site-mirror", "uris": ["http://mirror.example.internal/debian"], "suites": ["bookworm"],
          "components": ["main", "non-free", "non-free-firmware"], "key_file": "keys/site.asc"}
CUDA = {"name": "nvidia-cuda", "uris": ["https://mirror.example.internal/cuda/debian12/x86_64/"], "suites": ["/"],
        "key_file": "keys/cuda.asc"}


def settings(*sources: dict) -> HostSettings:
    return HostSettings.model_validate({**SETTINGS.model_dump(exclude_none=True), "apt_sources": list(sources)})


def test_each_source_is_a_deb822_file_signed_by_its_own_key():
    files = D.source_files(settings(MIRROR, CUDA).apt_sources, {"site-mirror": KEY, "nvidia-cuda": KEY})
    assert [(f.path, f.mode, f.owner, f.step) for f in files] == [
        ("/etc/apt/keyrings/llmfleet-site-mirror.asc", 0o644, "root", "sources"),
        ("/etc/apt/sources.list.d/llmfleet-site-mirror.sources", 0o644, "root", "sources"),
        ("/etc/apt/keyrings/llmfleet-nvidia-cuda.asc", 0o644, "root", "sources"),
        ("/etc/apt/sources.list.d/llmfleet-nvidia-cuda.sources", 0o644, "root", "sources"),
    ]
    assert files[0].content == KEY
    assert files[1].content == (
        "# Written by llmfleet provision from the inventory (llmfleet_apt_sources[0]: site-mirror)\n"
        "Types: deb\nURIs: http://mirror.example.internal/debian\nSuites: bookworm\n"
        "Components: main non-free non-free-firmware\nSigned-By: /etc/apt/keyrings/llmfleet-site-mirror.asc\n")
    assert "Components" not in files[3].content and "Suites: /\n" in files[3].content  # a flat repository


def test_the_sources_step_writes_them_before_any_package_and_the_facts_read_them():
    s = settings(MIRROR)
    extra = D.source_files(s.apt_sources, {"site-mirror": KEY})
    d = D.desired_state("h1", s, bare(), user="deploy", extra_files=extra)
    steps = S.plan_steps(d, bare())
    assert steps[0].name == "sources"
    assert "write /etc/apt/sources.list.d/llmfleet-site-mirror.sources (new, 0644 root:root)" in steps[0].changes
    assert steps[0].script.endswith("apt-get -q update")
    q = D.facts_query(s, "deploy")
    assert {"/etc/apt/keyrings/llmfleet-site-mirror.asc", "/etc/apt/sources.list.d/llmfleet-site-mirror.sources",
            D.DRIVER_PIN_FILE} <= set(q.files)


@pytest.mark.parametrize("change, says", [
    ({"components": ["main"], "suites": ["/"]}, "a flat repository's suite (/) takes no components"),
    ({"components": []}, "give components"),
    ({"uris": ["ftp://x/debian"]}, "uris"),
    ({"uris": ["http://x/debian'; rm -rf /"]}, "uris"),
    ({"name": "Site Mirror"}, "name"),
    ({"key_file": ""}, "key_file"),
])
def test_a_bad_source_is_refused(change, says):
    with pytest.raises((ValueError, InventoryError), match=re.escape(says)):
        settings({**MIRROR, **change})


def test_two_sources_of_one_name_are_refused():
    with pytest.raises(ValueError, match="apt source name 'site-mirror' appears twice"):
        settings(MIRROR, MIRROR)


def test_the_key_must_be_ascii_armored():
    assert D.check_key(KEY, "x") == KEY
    with pytest.raises(UsageError, match=r"^host h1: llmfleet_apt_sources\[0\].key_file k: not an ASCII-armored .*--armor"):
        D.check_key("\x99\x01\x0dbinary keyring", "host h1: llmfleet_apt_sources[0].key_file k")


def test_the_cli_reads_keys_from_the_inventory_folder_and_names_a_missing_one(tmp_path: Path):
    from llmfleet.cli.provision_tasks import _source_files

    inv = tmp_path / "hosts.yml"
    inv.write_text("all: {}\n")
    (tmp_path / "keys").mkdir()
    (tmp_path / "keys" / "site.asc").write_text(KEY)
    host = Host(name="h1", vars={}, inventory_file=str(inv))
    files = _source_files(host, settings(MIRROR), str(inv))
    assert files[0].content == KEY
    with pytest.raises(UsageError, match=r"^host h1: llmfleet_apt_sources\[1\].key_file .*keys/cuda.asc: cannot be "
                                         r"read \(No such file or directory\)"):
        _source_files(host, settings(MIRROR, CUDA), str(inv))
