"""Careless commands: ssh (rows for tests/test_careless_commands.py; tests/careless.py says what each asserts)."""

from tests.careless import Cmd

ROWS: list[Cmd] = []
