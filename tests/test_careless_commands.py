"""The careless-commands table (tests/careless.py says what every row asserts), run against the installed
wheel in a fresh folder whose hosts cannot answer."""

from __future__ import annotations

import pytest

from tests import careless
from tests.careless_rows_basic import ROWS as BASIC
from tests.careless_rows_flags import ROWS as FLAGS
from tests.careless_rows_readme import ROWS as README
from tests.careless_rows_ssh import ROWS as SSH
from tests.careless_rows_tasks import ROWS as TASKS

ROWS = [*BASIC, *SSH, *FLAGS, *TASKS, *README]


@pytest.fixture(scope="module")
def fleet(installed_wheel, tmp_path_factory):
    from tests.wheel_fixture import clean_env

    home = tmp_path_factory.mktemp("careless-home")
    folder = tmp_path_factory.mktemp("careless-fleet")
    env = {**clean_env(), "HOME": str(home), "COLUMNS": "200", "XDG_CACHE_HOME": str(home / ".cache")}
    for k in ("ANSIBLE_CONFIG", "ANSIBLE_INVENTORY", "SSH_AUTH_SOCK"):
        env.pop(k, None)
    f = careless.Fleet(installed_wheel.llmfleet, folder, env)
    yield f
    f.close()


def test_the_table_has_no_duplicate_rows():
    ids = [r.id for r in ROWS]
    assert len(ids) == len(set(ids)), [i for i in ids if ids.count(i) > 1]


@pytest.mark.parametrize("cmd", ROWS, ids=[r.id for r in ROWS])
def test_a_careless_command_ends_in_one_clear_line(fleet, cmd):
    careless.check(fleet, cmd)
