"""Shared fixtures. Lab fixtures live in tests/lab/conftest.py."""

pytest_plugins = ["tests.sshd_fixture"]
