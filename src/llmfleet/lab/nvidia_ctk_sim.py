#!/usr/bin/python3
"""nvidia-ctk SIMULATOR (stand-in) for bare lab hosts: shipped as ``/usr/bin/nvidia-ctk`` by the lab
repository's stand-in ``nvidia-container-toolkit-base`` package (llmfleet.lab.standin_debs).

It does what provisioning asks of the real NVIDIA Container Toolkit CLI, on the same files:
- ``nvidia-ctk --version``: ``NVIDIA Container Toolkit CLI version X.Y.Z`` (the package's version);
- ``nvidia-ctk runtime configure --runtime=docker [--config=PATH] [--set-as-default]``: adds the
  ``nvidia`` runtime (``nvidia-container-runtime``) to Docker's daemon.json, keeping every other key,
  like the real command; other runtimes are refused, as this stand-in knows only Docker.

Pure functions (``configure_docker``, ``run``) take text and return text; only ``main`` touches files.
Standard library only: it runs on the host's python3.
"""

from __future__ import annotations

import json
import os
import sys

VERSION = "@VERSION@"  # filled in by the stand-in package build
DAEMON_JSON = "/etc/docker/daemon.json"
RUNTIME_PATH = "nvidia-container-runtime"
USAGE = ("NAME:\n   NVIDIA Container Toolkit CLI (SIMULATOR)\n\nUSAGE:\n"
         "   nvidia-ctk [--version] runtime configure --runtime=docker [--config=PATH] [--set-as-default]\n")


def version_text(version: str) -> str:
    return f"NVIDIA Container Toolkit CLI version {version}\ncommit: SIMULATOR\n"


def configure_docker(current: str | None, set_as_default: bool = False) -> str:
    """daemon.json text with the ``nvidia`` runtime added (4-space indent, as the real command writes).
    ``current`` None or blank: no file yet. Raises ValueError on a file that is not a JSON object."""
    data = json.loads(current) if current and current.strip() else {}
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    found = data.get("runtimes")
    runtimes: dict = found if isinstance(found, dict) else {}
    runtimes["nvidia"] = {"args": [], "path": RUNTIME_PATH}
    data["runtimes"] = runtimes
    if set_as_default:
        data["default-runtime"] = "nvidia"
    return json.dumps(data, indent=4) + "\n"


def _opts(args: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    i = 0
    while i < len(args):
        a = args[i]
        if a.startswith("--") and "=" in a:
            k, v = a[2:].split("=", 1)
            out[k] = v
        elif a.startswith("--") and a[2:] in ("runtime", "config") and i + 1 < len(args):
            out[a[2:]] = args[i + 1]
            i += 1
        elif a.startswith("--"):
            out[a[2:]] = "true"
        else:
            out.setdefault("_extra", a)
        i += 1
    return out


def run(argv: list[str], read, write, version: str = VERSION) -> tuple[str, str, int]:
    """One command line (without argv[0]) -> (stdout, stderr, exit code). ``read(path)`` gives a file's
    text or None; ``write(path, text)`` stores it."""
    if argv in (["--version"], ["-v"]):
        return version_text(version), "", 0
    if argv[:2] != ["runtime", "configure"]:
        return USAGE, "", 1 if argv else 0
    opts = _opts(argv[2:])
    runtime = opts.get("runtime", "docker")
    if runtime != "docker" or "_extra" in opts:
        return "", f'ERRO[0000] unsupported runtime "{runtime}" (this SIMULATOR configures docker only)\n', 1
    path = opts.get("config", DAEMON_JSON)
    current = read(path)
    try:
        text = configure_docker(current, opts.get("set-as-default") in ("true", "1"))
    except ValueError as exc:
        return "", f"ERRO[0000] unable to load config: {path}: {exc}\n", 1
    write(path, text)
    note = "" if current else "INFO[0000] Config file does not exist; using empty config\n"
    return "", (f"{note}INFO[0000] Wrote updated config to {path}\n"
                "INFO[0000] It is recommended that docker daemon be restarted.\n"), 0


def _read(path: str) -> str | None:  # pragma: no cover - the imperative shell, run on lab hosts
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    except FileNotFoundError:
        return None


def _write(path: str, text: str) -> None:  # pragma: no cover
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = f"{path}.nvidia-ctk.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.replace(tmp, path)


def main() -> int:  # pragma: no cover
    out, err, rc = run(sys.argv[1:], _read, _write)
    sys.stdout.write(out)
    sys.stderr.write(err)
    return rc


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
