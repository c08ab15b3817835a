"""Shared fixtures. Lab fixtures live in tests/lab/conftest.py."""

pytest_plugins = ["tests.sshd_fixture"]


import pytest  # noqa: E402


@pytest.fixture(scope="session")
def installed_wheel(tmp_path_factory):
    """llmfleet built as a wheel and installed into a fresh virtualenv outside the checkout."""
    from tests.wheel_fixture import build_and_install

    return build_and_install(tmp_path_factory.mktemp("wheel"))


@pytest.fixture(scope="session", autouse=True)
def _private_cache_per_session(tmp_path_factory):
    """The per-user cache (kept templates and catalogs, the deploy's guesses, the fleet's speed
    history) in a folder of this test session: a test never reads what another run left, nor leaves
    records of its test hosts in the user's own cache."""
    import os

    before = os.environ.get("XDG_CACHE_HOME")
    folder = tmp_path_factory.mktemp("xdg-cache")
    folder.chmod(0o700)
    os.environ["XDG_CACHE_HOME"] = str(folder)
    yield
    if before is None:
        os.environ.pop("XDG_CACHE_HOME", None)
    else:
        os.environ["XDG_CACHE_HOME"] = before
