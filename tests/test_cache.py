"""llmfleet's private cache folders: an entry is read back only from a folder this user alone can
write, only when it is what was asked for, and a damaged entry is built again."""

from __future__ import annotations

import os
from dataclasses import dataclass

import pytest

from llmfleet import cache


@dataclass
class Thing:
    n: int


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    return tmp_path / "llmfleet" / "things"


def test_a_kept_object_is_read_back_instead_of_built(home):
    built = []
    make = lambda: built.append(1) or Thing(7)  # noqa: E731
    assert cache.kept_object("things", "k" * 64, make, Thing) == Thing(7)
    assert cache.kept_object("things", "k" * 64, make, Thing) == Thing(7)
    assert built == [1]
    (entry,) = home.iterdir()
    assert oct(entry.stat().st_mode & 0o777) == "0o600" and oct(home.stat().st_mode & 0o777) == "0o700"


def test_a_damaged_or_foreign_entry_is_built_again(home):
    cache.kept_object("things", "k" * 64, lambda: Thing(1), Thing)
    (entry,) = home.iterdir()
    entry.write_bytes(b"not a pickle")
    assert cache.kept_object("things", "k" * 64, lambda: Thing(2), Thing) == Thing(2)
    import pickle

    entry.write_bytes(pickle.dumps({"n": 3}))  # a value of another kind
    assert cache.kept_object("things", "k" * 64, lambda: Thing(4), Thing) == Thing(4)


def test_a_folder_others_can_write_is_never_read(home):
    cache.kept_object("things", "k" * 64, lambda: Thing(1), Thing)
    os.chmod(home, 0o777)
    assert cache.kept_object("things", "k" * 64, lambda: Thing(5), Thing) == Thing(5)


def test_the_engine_catalog_is_kept_validated_and_read_back_the_same(home, monkeypatch):
    from llmfleet.knowledge import compat

    compat.load_engine_catalog.cache_clear()
    first = compat.load_engine_catalog()
    compat.load_engine_catalog.cache_clear()
    again = compat.load_engine_catalog()
    compat.load_engine_catalog.cache_clear()
    assert again == first and again is not first
    assert any((home.parent / compat.CATALOG_CACHE).iterdir())
