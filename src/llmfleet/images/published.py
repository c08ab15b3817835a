"""What an engine release publishes, read from where it is published: its wheels (``pip download
--no-deps`` from the package index pip is configured for, or files given), a checkout of a llama.cpp
tag, and the draft file ``catalog.release --write`` keeps. The imperative shell of
``llmfleet.images.release_draft``, which drafts from the contents alone.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from llmfleet.errors import UsageError
from llmfleet.images import vllm_rules
from llmfleet.images.release_draft import (
    DRAFT_HEADER,
    LLAMACPP_FILES,
    TORCH_LIBRARY,
    Wheel,
    core_libraries,
    draft_vllm,
    library_archs,
    metadata_field,
    parse_library_line,
    parse_spec,
    render_drafts,
    requires,
)

# pip's platform tags for a Linux x86_64 host with glibc 2.39 (pip takes only the tags given): vLLM has
# published manylinux1, manylinux_2_28 and manylinux_2_31 wheels
PLATFORMS = (*(f"manylinux_2_{m}_x86_64" for m in range(39, 16, -1)), "manylinux2014_x86_64", "manylinux1_x86_64")
PYTHON = "3.12"


def read_wheel(path: Path, only: re.Pattern[str] | str | None = None) -> Wheel:
    """METADATA and the fatbin archs of the wheel's ``.so`` files (``only``: those paths alone)."""
    try:
        z = zipfile.ZipFile(path)
    except (OSError, zipfile.BadZipFile) as exc:
        raise UsageError(f"{path.name}: not a readable wheel ({exc})") from None
    with z:
        names = z.namelist()
        meta = next((n for n in names if n.endswith(".dist-info/METADATA")), None)
        if meta is None:
            raise UsageError(f"{path.name}: no .dist-info/METADATA in the wheel")
        wheel = Wheel(path.name, z.read(meta).decode("utf-8", "replace"))
        for n in names:
            # the files the rules are read from: QuantizationMethods and each method's config (its
            # get_min_capability), each v1 attention backend, and the model registry
            if n == vllm_rules.REGISTRY or (n.endswith(".py") and n.startswith((vllm_rules.QUANT_DIR,
                                                                                 vllm_rules.BACKENDS_DIR))):
                wheel.texts[n] = z.read(n).decode("utf-8", "replace")
            if not re.search(r"\.so(\.\d+)*$", n):
                continue
            if isinstance(only, str) and n != only:
                continue
            if isinstance(only, re.Pattern) and not only.search(n):
                continue
            wheel.libraries[n] = library_archs(z.read(n))
    return wheel


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def wheel_of(requirement: str, wheels: list[Path]) -> Path | None:
    """The wheel of ``requirement`` (NAME==VERSION) among ``wheels`` (a folder may hold other releases'
    wheels): its file name's distribution and version; None when none is of it. A requirement without
    an exact version takes the only wheel there is."""
    m = re.fullmatch(r"\s*([A-Za-z0-9][A-Za-z0-9_.-]*)\s*==\s*([^\s;,]+)\s*", requirement)
    if m is None:
        return wheels[0] if len(wheels) == 1 else None
    name, version = _norm(m.group(1)), m.group(2)
    for w in wheels:
        parts = w.name.split("-")
        if len(parts) >= 2 and _norm(parts[0]) == name and parts[1] == version:
            return w
    return None


def fetch_wheel(requirement: str, dest: Path, *, pip: list[str] | None = None, timeout: float = 1800) -> Path:
    """``pip download --no-deps`` one Linux x86_64 wheel into ``dest``; UsageError (one line) when the
    release does not exist, has no such wheel, or the index cannot be reached."""
    cmd = [*(pip or [sys.executable, "-m", "pip"]), "download", "--no-deps", "--no-cache-dir", "--only-binary=:all:",
           "--python-version", PYTHON, "--disable-pip-version-check", "-d", str(dest)]
    for p in PLATFORMS:
        cmd += ["--platform", p]
    cmd.append(requirement)
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                             env={**os.environ, "PIP_NO_INPUT": "1"})
    except subprocess.TimeoutExpired:
        raise UsageError(f"{requirement}: pip download took over {timeout:.0f} s") from None
    except OSError as exc:
        raise UsageError(f"cannot run pip: {exc.strerror}") from None
    out = res.stdout + res.stderr
    wheel = wheel_of(requirement, sorted(dest.glob("*.whl")))
    if res.returncode == 0 and wheel is not None:
        return wheel
    unreachable = re.search(r"NewConnectionError|Failed to establish|Could not fetch URL|ConnectionError|"
                            r"Max retries exceeded|Temporary failure in name resolution|timed out", out)
    if unreachable:
        raise UsageError(f"{requirement}: the package index pip is configured for cannot be reached "
                         "(no network?); nothing written")
    if re.search(r"No matching distribution found|Could not find a version", out):
        raise UsageError(f"{requirement}: no such release with a Linux x86_64 wheel on the package index "
                         "(`pip index versions NAME` lists the published ones); nothing written")
    last = next((ln.strip() for ln in reversed(out.splitlines()) if ln.strip()), f"exit {res.returncode}")
    raise UsageError(f"{requirement}: pip download failed: {last}")


Progress = Callable[[str, bool], None]  # (line, done): a step begun, or one finished


def _fetch(requirement: str, dest: Path, pip: list[str] | None, progress: Progress) -> Path:
    progress(f"{requirement}: pip download --no-deps (a CUDA wheel is hundreds of MB)", False)
    t0 = time.monotonic()
    path = fetch_wheel(requirement, dest, pip=pip)
    progress(f"{requirement}: {path.name}, {path.stat().st_size / 1e6:,.0f} MB in {time.monotonic() - t0:.0f} s; "
             "reading its libraries", True)
    return path


def draft_release(spec: str, toolkits: dict[str, list[str]], *, wheel: Path | None = None,
                  torch_wheel: Path | None = None, with_torch: bool = True,
                  pip: list[str] | None = None, progress: Progress = lambda line, done: None) -> dict[str, Any]:
    """Fetch (or take the given files) and draft. Downloads go to a temporary folder that is removed
    before this returns, whatever happens; ``progress`` is told when each download begins and ends."""
    engine, version = parse_spec(spec)
    with tempfile.TemporaryDirectory(prefix="llmfleet-release-") as tmp:
        tmpdir = Path(tmp)
        if wheel is None:
            (tmpdir / "vllm").mkdir()
            wheel = _fetch(f"{engine}=={version}", tmpdir / "vllm", pip, progress)
        vw = read_wheel(wheel)
        if (metadata_field(vw.metadata, "Name") or "").lower() != engine:
            raise UsageError(f"{wheel.name}: not a {engine} wheel")
        got = metadata_field(vw.metadata, "Version")
        if got != version:
            raise UsageError(f"{wheel.name}: version {got}, not {version}")
        core_libraries(vw)  # before any torch download
        if wheel.parent == tmpdir / "vllm":
            wheel.unlink()  # the largest file: gone before the torch wheel comes
        tw = None
        pin = requires(vw.metadata, "torch")
        if torch_wheel is not None:
            tw = read_wheel(torch_wheel, TORCH_LIBRARY)
            tv = metadata_field(tw.metadata, "Version")
            if (metadata_field(tw.metadata, "Name") or "").lower() != "torch" or (pin and (tv or "").split("+")[0] != pin):
                raise UsageError(f"{torch_wheel.name}: not the torch {pin} wheel that {engine} {version} pins "
                                 f"(it is {metadata_field(tw.metadata, 'Name')} {tv})")
        elif with_torch and pin:
            (tmpdir / "torch").mkdir()
            path = _fetch(f"torch=={pin}", tmpdir / "torch", pip, progress)
            tw = read_wheel(path, TORCH_LIBRARY)
            path.unlink()
        return draft_vllm(vw, tw, toolkits)


def write_draft(path: Path, draft: dict[str, Any], packaged: Path) -> None:
    """Add (or replace) one draft in a draft file, atomically; never the packaged catalog."""
    import yaml

    if path.resolve() == packaged.resolve():
        raise UsageError(f"{path}: the packaged catalog is not written by catalog.release; give a draft file")
    drafts: list[dict[str, Any]] = []
    if path.exists():
        try:
            doc = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise UsageError(f"{path}: not a readable draft file ({str(exc).splitlines()[0]})") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("images", {}), dict):
            raise UsageError(f"{path}: not a draft file written by catalog.release")
        for key, entry in (doc.get("images") or {}).items():
            if key == draft["key"]:
                continue
            libs = (doc.get("libraries") or {}).get(key) or {}
            drafts.append({"key": key, "entry": entry, "provenance": (doc.get("provenance") or {}).get(key, {}),
                           "not_drafted": (doc.get("not_drafted") or {}).get(key, []),
                           "libraries": {p: parse_library_line(v) for p, v in libs.items()}})
    drafts.append(draft)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text(DRAFT_HEADER + render_drafts(drafts), encoding="utf-8")
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise UsageError(f"{path}: cannot write: {exc.strerror}") from None


def read_llamacpp_checkout(root: Path) -> dict[str, str]:
    """The files draft_llamacpp reads, from a checkout of the tag (those present)."""
    out = {}
    for rel in LLAMACPP_FILES:
        p = root / rel
        if p.is_file():
            out[rel] = p.read_text(encoding="utf-8", errors="replace")
    return out
