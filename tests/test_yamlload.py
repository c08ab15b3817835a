"""llmfleet's own data files parsed once and kept (yamlload.safe_load(keep=True)); never an inventory."""

from __future__ import annotations

import pytest

from llmfleet import cache, yamlload
from llmfleet.inventory.ansible import load_inventory
from llmfleet.knowledge import catalog

BIG = "".join(f"key{i}: {{name: value {i}, list: [1, 2.5, true, null, 'x']}}\n" for i in range(200))


@pytest.fixture
def folder(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return cache.cache_dir(yamlload.CACHE)


def _no_parse(monkeypatch):
    def fail(text):
        raise AssertionError("parsed again")
    monkeypatch.setattr(yamlload, "_parse", fail)


def test_a_kept_file_is_read_back_without_parsing_from_a_private_file(folder, monkeypatch):
    first = yamlload.safe_load(BIG, keep=True)
    [kept] = folder.iterdir()
    assert kept.stat().st_mode & 0o777 == 0o600 and folder.stat().st_mode & 0o777 == 0o700
    _no_parse(monkeypatch)
    again = yamlload.safe_load(BIG, keep=True)
    assert again == first and again is not first  # a fresh object each time, as a parse gives
    assert again["key7"] == {"name": "value 7", "list": [1, 2.5, True, None, "x"]}


def test_a_changed_text_is_parsed_again(folder):
    yamlload.safe_load(BIG, keep=True)
    changed = BIG.replace("value 7", "value seven")
    assert yamlload.safe_load(changed, keep=True)["key7"]["name"] == "value seven"
    assert len(list(folder.iterdir())) == 2


def test_nothing_is_kept_without_keep_for_small_texts_or_for_values_marshal_cannot_hold(folder):
    yamlload.safe_load(BIG)
    yamlload.safe_load("a: 1\n", keep=True)
    dated = BIG + "measured: 2026-12-01\n"
    assert str(yamlload.safe_load(dated, keep=True)["measured"]) == "2026-12-01"
    assert not folder.exists() or not list(folder.iterdir())


def test_a_folder_others_can_write_to_is_neither_read_nor_written(folder, monkeypatch):
    folder.mkdir(parents=True)
    folder.chmod(0o777)
    planted = {"key7": "planted"}
    import marshal

    (folder / f"{yamlload.cache_key(BIG)[:40]}.marshal").write_bytes(marshal.dumps(planted))
    assert yamlload.safe_load(BIG, keep=True)["key7"] == {"name": "value 7", "list": [1, 2.5, True, None, "x"]}
    assert len(list(folder.iterdir())) == 1  # only the planted file: nothing written there


def test_the_catalogs_are_kept_and_an_inventory_with_a_secret_is_not(folder, tmp_path):
    catalog.load_gpus.cache_clear()
    catalog.load_gpus()
    assert list(folder.iterdir())  # the GPU catalog was kept
    before = set(folder.iterdir())
    inv = tmp_path / "inv"
    inv.mkdir()
    (inv / "hosts.yml").write_text(
        "all:\n  hosts:\n    h1: {ansible_host: 127.0.0.1}\n  vars:\n    api_key: sk-topsecret-0123456789\n"
        + "".join(f"    pad{i}: '{'x' * 40}'\n" for i in range(80)))
    load_inventory(inv)
    assert set(folder.iterdir()) == before
    assert not any(b"sk-topsecret" in p.read_bytes() for p in folder.iterdir())


def test_the_parsers_stay_pure_and_only_their_loaders_keep(folder, tmp_path):
    from llmfleet.images.lock import PACKAGED_LOCK, load_lock, parse_lock
    from llmfleet.knowledge import compat

    compat.parse_engine_catalog(compat.ENGINES_PATH.read_text(encoding="utf-8"))
    lock = tmp_path / "images.lock"  # the packaged lock (over the size worth keeping)
    lock.write_text(PACKAGED_LOCK.read_text())
    parse_lock(lock.read_text())
    assert not folder.exists() or not list(folder.iterdir())
    compat.load_engine_catalog.cache_clear()
    compat.load_engine_catalog()
    load_lock(lock)
    assert len(list(folder.iterdir())) == 2
