"""``!vault`` values: opaque in the inventory, printed as ansible-inventory prints them, decrypted only
for what llmfleet needs (an API key) with the vault password file. The ciphertexts are made by the
real ``ansible-vault`` (ansible-core, the dev extra)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from llmfleet.inventory.ansible import check_all, load_inventory
from llmfleet.inventory.vault import Vault, VaultError, decrypt
from llmfleet.release.deploy import resolve_secret

ANSIBLE_VAULT = shutil.which("ansible-vault") or str(Path(sys.executable).parent / "ansible-vault")
ANSIBLE_INVENTORY = shutil.which("ansible-inventory") or str(Path(sys.executable).parent / "ansible-inventory")
SECRET = "sk-live-0123456789abcdef"


def encrypt(tmp: Path, text: str, name: str, password: str = "correct horse", vault_id: str | None = None) -> str:
    pw = tmp / f"pw-{password.replace(' ', '_')}"
    pw.write_text(password + "\n")
    args = [ANSIBLE_VAULT, "encrypt_string", "--name", name]
    args += ["--vault-id", f"{vault_id}@{pw}"] if vault_id else ["--vault-password-file", str(pw)]
    out = subprocess.run([*args, text], capture_output=True, text=True, check=True, timeout=120,
                         env={"PATH": os.environ.get("PATH", ""), "HOME": str(tmp), "ANSIBLE_LOCAL_TEMP": str(tmp / ".t")})
    return out.stdout


@pytest.fixture
def vaulted(tmp_path: Path) -> Path:
    inv = tmp_path / "inv"
    (inv / "host_vars").mkdir(parents=True)
    (inv / "hosts.yml").write_text("gpu:\n  hosts:\n    gpu-1: {llmfleet_gpu: rtx-4090}\n")
    (inv / "group_vars").mkdir()
    (inv / "group_vars" / "all.yml").write_text(encrypt(tmp_path, SECRET, "vault_api_key"))
    (inv / "host_vars" / "gpu-1.yml").write_text(
        "llmfleet_services:\n  - name: chat\n    engine: vllm\n    model: qwen2.5-7b-instruct\n"
        "    model_path: /models/q\n    image: vllm:0.9.2\n    api_key: '{{ vault_api_key }}'\n"
    )
    return inv


def test_vault_values_print_as_ansible_inventory_prints_them(vaulted: Path) -> None:
    inv = load_inventory(vaulted)
    expected = subprocess.run([ANSIBLE_INVENTORY, "-i", str(vaulted), "--host", "gpu-1"], capture_output=True,
                              text=True, check=True, timeout=120,
                              env={"PATH": os.environ.get("PATH", ""), "HOME": str(vaulted.parent),
                                   "ANSIBLE_LOCAL_TEMP": str(vaulted.parent / ".t")}).stdout
    assert json.loads(json.dumps(inv.host_json("gpu-1"))) == json.loads(expected)
    assert SECRET not in json.dumps(inv.to_ansible_list())


def test_api_key_from_a_vaulted_variable_is_decrypted_with_the_password_file(vaulted: Path, monkeypatch) -> None:
    svc = check_all(load_inventory(vaulted))["gpu-1"].services[0]
    assert svc.api_key is not None and svc.api_key.vault is not None
    assert SECRET not in repr(svc) and SECRET not in svc.model_dump_json()
    monkeypatch.setenv("ANSIBLE_VAULT_PASSWORD_FILE", str(vaulted.parent / "pw-correct_horse"))
    assert resolve_secret(svc, "host gpu-1: service chat") == SECRET


def test_without_a_password_file_the_error_names_the_variable(vaulted: Path, monkeypatch) -> None:
    monkeypatch.delenv("ANSIBLE_VAULT_PASSWORD_FILE", raising=False)
    svc = check_all(load_inventory(vaulted))["gpu-1"].services[0]
    with pytest.raises(VaultError, match=r"host gpu-1: service chat: api_key is vault-encrypted; give "
                                         r"--vault-password-file PATH or set ANSIBLE_VAULT_PASSWORD_FILE"):
        resolve_secret(svc, "host gpu-1: service chat")


def test_wrong_password_is_one_clear_error(tmp_path: Path) -> None:
    from llmfleet.inventory.values import VaultValue

    text = encrypt(tmp_path, SECRET, "k").split("!vault |", 1)[1]
    value = VaultValue("\n".join(line.strip() for line in text.strip().splitlines()))
    (tmp_path / "wrong").write_text("nope\n")
    with pytest.raises(VaultError, match=r"api_key: the vault password does not decrypt it") as err:
        Vault(str(tmp_path / "wrong")).decrypt(value, "api_key")
    assert SECRET not in str(err.value)


def test_vault_id_format_and_executable_password_file(tmp_path: Path) -> None:
    from llmfleet.inventory.values import VaultValue

    text = encrypt(tmp_path, SECRET, "k", password="s3cret", vault_id="prod").split("!vault |", 1)[1]
    value = VaultValue("\n".join(line.strip() for line in text.strip().splitlines()))
    assert value.ciphertext.startswith("$ANSIBLE_VAULT;1.2;AES256;prod")
    script = tmp_path / "pw.sh"
    script.write_text("#!/bin/sh\necho s3cret\n")
    script.chmod(0o700)
    assert Vault(str(script)).decrypt(value, "k") == SECRET
    assert decrypt(value, b"s3cret") == SECRET


def test_inventory_check_decrypts_with_the_flag(vaulted: Path) -> None:
    repo = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if k != "ANSIBLE_VAULT_PASSWORD_FILE"}
    bad = vaulted.parent / "bad-pw"
    bad.write_text("wrong\n")
    res = subprocess.run([sys.executable, "-m", "invoke", "inventory", "-i", str(vaulted), "--check",
                          "--vault-password-file", str(bad)], cwd=repo, capture_output=True, text=True,
                         timeout=120, env=env)
    assert res.returncode == 2, res.stderr
    assert "service chat: api_key: the vault password does not decrypt it" in res.stderr
    assert "Traceback" not in res.stderr and SECRET not in res.stderr + res.stdout


def test_a_vars_file_encrypted_whole_is_decrypted_or_skipped_with_a_warning(tmp_path: Path, monkeypatch) -> None:
    inv = tmp_path / "inv"
    (inv / "group_vars" / "all").mkdir(parents=True)
    (inv / "hosts").write_text("[gpu]\ngpu-1\n")
    (inv / "group_vars" / "all" / "plain.yml").write_text("plain: 1\n")
    vault_file = inv / "group_vars" / "all" / "vault.yml"
    vault_file.write_text("vault_api_key: sk-file-secret\nsite: ams\n")
    pw = tmp_path / "pw"
    pw.write_text("file pass\n")
    subprocess.run([ANSIBLE_VAULT, "encrypt", "--vault-password-file", str(pw), str(vault_file)], check=True,
                   capture_output=True, timeout=120,
                   env={"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path), "ANSIBLE_LOCAL_TEMP": str(tmp_path / ".t")})
    assert vault_file.read_text().startswith("$ANSIBLE_VAULT;1.1;AES256")
    monkeypatch.delenv("ANSIBLE_VAULT_PASSWORD_FILE", raising=False)
    with pytest.warns(UserWarning, match=r"vault.yml: vault-encrypted; its variables are not loaded"):
        skipped = load_inventory(inv)
    assert skipped.hosts["gpu-1"].vars == {"plain": 1}
    opened = load_inventory(inv, vault_password_file=str(pw))
    assert opened.hosts["gpu-1"].vars == {"plain": 1, "vault_api_key": "sk-file-secret", "site": "ams"}
