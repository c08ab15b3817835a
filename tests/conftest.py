"""Shared fixtures. Lab fixtures live in tests/lab/conftest.py."""

pytest_plugins = ["tests.sshd_fixture"]


import pytest  # noqa: E402


@pytest.fixture(scope="session")
def installed_wheel(tmp_path_factory):
    """llmfleet built as a wheel and installed into a fresh virtualenv outside the checkout."""
    from tests.wheel_fixture import build_and_install

    return build_and_install(tmp_path_factory.mktemp("wheel"))
