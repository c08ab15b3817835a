"""images.* from a folder that is not llmfleet's source: images.lint / images.build without a dockerfiles/
folder say so (exit 2, one line); a failed images.pin leaves no ./images.lock copy behind."""

from __future__ import annotations

import pytest

import llmfleet.cli.images_tasks as images_tasks
import llmfleet.images.lock as lock_mod
from llmfleet.cli import ns
from llmfleet.cli.main import LlmfleetProgram
from llmfleet.errors import RemoteError


def run(argv, capsys):
    code = 0
    try:
        LlmfleetProgram(namespace=ns, name="llmfleet", binary="llmfleet").run(["llmfleet", *argv], exit=True)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("argv", [["images.lint"], ["images.build", "vllm-volta"]])
def test_no_dockerfiles_folder_is_a_usage_error(argv, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("INVOKE_LLMFLEET_DOCKERFILES", str(tmp_path / "dockerfiles"))
    code, out, err = run(argv, capsys)
    assert code == 2 and not out
    assert err.strip().splitlines() == [err.strip()] and "no dockerfiles folder at" in err


def test_no_dockerfiles_folder_beside_an_installed_llmfleet(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(lock_mod, "DOCKERFILES_DIR", tmp_path / "site-packages" / "dockerfiles")
    code, _out, err = run(["images.lint"], capsys)
    assert code == 2 and "no dockerfiles folder at ./dockerfiles" in err
    code, out, _err = run(["images.list"], capsys)  # listing needs no dockerfiles
    assert code == 0 and "vllm:" in out


@pytest.fixture
def installed(tmp_path, monkeypatch):
    """As from a pip install: the lock shipped in the package is not the project's."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(images_tasks, "_in_checkout", lambda: False)
    return tmp_path


def test_a_failed_pin_leaves_nothing_behind(installed, monkeypatch, capsys):
    def unreachable(*a, **k):
        raise RemoteError("registry-1.docker.io: no route to host")

    monkeypatch.setattr(lock_mod, "pin", unreachable)
    code, _out, err = run(["images.pin", "vllm=0.19.1"], capsys)
    assert code == 1 and "no route to host" in err
    assert not (installed / "images.lock").exists()
    assert "created" not in err


def test_a_pin_that_works_keeps_its_lock(installed, monkeypatch, capsys):
    def pinned(specs, client, path):
        return [lock_mod.LockedImage(key=s.key, repository="docker.io/vllm/vllm-openai", digest="sha256:" + "a" * 64)
                for s in specs]

    monkeypatch.setattr(lock_mod, "pin", pinned)
    code, _out, err = run(["images.pin", "vllm=0.19.1"], capsys)
    assert code == 0, err
    assert (installed / "images.lock").exists() and "created images.lock" in err
