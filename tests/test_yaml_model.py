"""One reader of a catalog file into its model: every failure is one line naming the file and the place."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from llmfleet.errors import UsageError
from llmfleet.knowledge import compat, driver_choice
from llmfleet.knowledge.yaml_model import load_model, read_catalog


class _Entry(BaseModel):
    name: str
    memory_mib: int


class _Doc(BaseModel):
    entries: list[_Entry]


@pytest.mark.parametrize(("text", "words"), [
    ("entries: [name: a\n", "cat.yaml: not valid YAML:"),
    ("entries:\n  - {name: a, memory_mib: lots}\n", "cat.yaml: entries.0.memory_mib: Input should be a valid integer"),
    ("entries:\n  - {memory_mib: 1}\n", "cat.yaml: entries.0.name: Field required"),
])
def test_a_bad_catalog_is_one_line_naming_the_file_and_the_place(text, words):
    with pytest.raises(UsageError) as exc:
        load_model(_Doc, text, "cat.yaml")
    assert words in str(exc.value) and "\n" not in str(exc.value)


def test_a_catalog_that_cannot_be_read_says_which_and_why(tmp_path):
    missing = tmp_path / "engines.yaml"
    with pytest.raises(UsageError, match=r"engines\.yaml: cannot read the engine catalog: No such file"):
        read_catalog(missing, "the engine catalog")
    with pytest.raises(UsageError, match="cannot read the engine catalog"):
        compat.load_engine_catalog(str(missing))
    with pytest.raises(UsageError, match="cannot read the provisioning catalog"):
        driver_choice.load_provisioning(str(tmp_path / "provisioning.yaml"))
