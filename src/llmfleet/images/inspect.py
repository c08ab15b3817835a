"""Read what an engine image really carries, by running it once without a GPU.

vLLM images: the image's own Python prints the torch version, ``torch.version.cuda``, the arch
flags torch was compiled with (``torch._C._cuda_getArchFlags()``, what ``torch.cuda.get_arch_list()``
returns on a machine with a GPU), the vLLM version, and the SASS/PTX archs in the fatbins of vLLM's
compiled extensions (``images.fatbin`` runs inside the image). llama.cpp images: the server binary
and its ggml libraries are copied out of a created (never started) container and their fatbins read
here; ``llama-server --version`` gives the build. The image's ``CUDA_VERSION`` environment variable
(set by the nvidia/cuda bases) gives its CUDA.

Pure: the docker argv builders, the output parsers and ``apply`` (an inspection -> lock entry).
The one shell function, ``inspect_image``, runs the commands through a runner.
"""

from __future__ import annotations

import io
import json
import re
import tarfile
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from llmfleet.errors import CheckFailed
from llmfleet.images import fatbin
from llmfleet.images.lock import LockedImage

MARK = "LLMFLEET-INSPECT "
TIMEOUT_S = 300
# files of a llama.cpp image whose fatbins are read
_LLAMA_FILES = re.compile(r"(^|/)(llama-server|lib(ggml|llama)[^/]*\.so[.0-9]*)$")
_MAX_MEMBER = 4 << 30

Runner = Callable[[list[str], float], tuple[int, bytes, bytes]]


@dataclass(frozen=True)
class Inspection:
    """What an image carries, as read from it."""

    key: str
    ref: str
    engine: str
    engine_version: str | None = None
    cuda: str | None = None
    torch: str | None = None
    torch_cuda: str | None = None
    torch_archs: tuple[str, ...] = ()
    archs: tuple[str, ...] = ()  # the engine's own kernels, lock notation
    files: tuple[str, ...] = ()  # what the kernels were read from
    notes: tuple[str, ...] = ()
    require_cuda: str | None = None  # the image's NVIDIA_REQUIRE_CUDA (what the container toolkit checks)

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "ref": self.ref, "engine": self.engine, "engine_version": self.engine_version,
                "cuda": self.cuda, "torch": self.torch, "torch_cuda": self.torch_cuda,
                "torch_archs": list(self.torch_archs), "archs": list(self.archs), "files": list(self.files),
                "notes": list(self.notes), "require_cuda": self.require_cuda}


# ------------------------------------------------------------------------------------------------
# Commands (pure)


def config_argv(ref: str, docker: str = "docker") -> list[str]:
    return [docker, "image", "inspect", "--format", "{{json .Config}}", ref]


def vllm_probe_script() -> str:
    """The Python the vLLM image runs: ``images.fatbin`` followed by the probe (stdlib + torch)."""
    return Path(fatbin.__file__).read_text(encoding="utf-8") + _VLLM_PROBE


_VLLM_PROBE = '''

def _probe():
    import glob, importlib.util, json, os
    out = {}
    try:
        import torch
        out["torch"] = torch.__version__
        out["torch_cuda"] = torch.version.cuda
        flags = getattr(torch._C, "_cuda_getArchFlags", None)
        out["torch_arch_flags"] = flags() if flags is not None else None
    except Exception as exc:  # a broken torch is what the inspection is for
        out["torch_error"] = f"{type(exc).__name__}: {exc}"[:300]
    try:
        from importlib.metadata import version
        out["vllm"] = version("vllm")
    except Exception as exc:
        out["vllm_error"] = f"{type(exc).__name__}: {exc}"[:300]
    try:
        spec = importlib.util.find_spec("vllm")
        root = os.path.dirname(spec.origin) if spec and spec.origin else None
    except Exception:
        root = None
    libs = sorted(glob.glob(os.path.join(root, "*.so"))) if root else []
    sass, ptx, read = set(), set(), []
    for lib in libs:
        try:
            with open(lib, "rb") as fh:
                s, p = fatbin_archs(fh.read())
        except Exception:
            continue
        if s or p:
            read.append(lib)
        sass.update(s)
        ptx.update(p)
    out["engine_libs"] = read
    out["engine_sass"] = sorted(sass)
    out["engine_ptx"] = sorted(ptx)
    print("''' + MARK + '''" + json.dumps(out), flush=True)


_probe()
'''


def vllm_argv(ref: str, docker: str = "docker") -> list[str]:
    return [docker, "run", "--rm", "--network", "none", "--entrypoint", "python3", ref, "-c", vllm_probe_script()]


def llama_version_argv(ref: str, docker: str = "docker") -> list[str]:
    return [docker, "run", "--rm", "--network", "none", ref, "--version"]


def create_argv(ref: str, docker: str = "docker") -> list[str]:
    return [docker, "create", ref]


def copy_argv(container: str, path: str, docker: str = "docker") -> list[str]:
    return [docker, "cp", f"{container}:{path}", "-"]


def remove_argv(container: str, docker: str = "docker") -> list[str]:
    return [docker, "rm", "-f", container]


# ------------------------------------------------------------------------------------------------
# Parsers (pure)


def parse_config(text: str) -> dict[str, Any]:
    """``docker image inspect --format {{json .Config}}`` -> {entrypoint, env, labels}."""
    try:
        data = json.loads(text or "null") or {}
    except ValueError:
        data = {}
    env = {}
    for item in data.get("Env") or []:
        k, _, v = str(item).partition("=")
        env[k] = v
    return {"entrypoint": list(data.get("Entrypoint") or []), "cmd": list(data.get("Cmd") or []), "env": env,
            "labels": dict(data.get("Labels") or {})}


def parse_vllm_probe(stdout: str) -> dict[str, Any]:
    """The probe's JSON line from the image's output (other lines, warnings, are skipped)."""
    for line in reversed(stdout.splitlines()):
        if line.startswith(MARK):
            try:
                return json.loads(line[len(MARK):])
            except ValueError:
                break
    raise CheckFailed("the vLLM image printed no inspection result (python3 missing, or the probe crashed)")


def torch_archs_from_flags(flags: str | None) -> tuple[str, ...]:
    """``"sm_70 sm_75 ... compute_120"`` (torch's arch flags) -> lock notation (``"12.0+PTX"``)."""
    if not flags:
        return ()
    from llmfleet.knowledge.compat import parse_archs

    k = parse_archs(flags.split())
    if k is None:
        return ()
    return tuple(fatbin.lock_archs(k.sass, k.ptx))


def parse_llama_version(text: str) -> str | None:
    """``version: 5000 (abcdef0)`` (llama-server --version) -> ``b5000 (abcdef0)``; other version
    words (a vendored build: ``version: 0.5.0-dev (build 1, commit 0c1e570)``) are kept as printed."""
    m = re.search(r"^version:\s*(\S+)\s*\(([^)]*)\)", text, re.M)
    if not m:
        return None
    word, detail = m.group(1), m.group(2)
    return f"b{word} ({detail})" if word.isdigit() else f"{word} ({detail})"


def archs_in_tar(data: bytes) -> tuple[list[str], list[str], list[str]]:
    """(SASS, PTX, files read) over the llama.cpp server binary and libraries in a tar stream
    (``docker cp CONTAINER:DIR -``)."""
    sass: set[str] = set()
    ptx: set[str] = set()
    read: list[str] = []
    with tarfile.open(fileobj=io.BytesIO(data), mode="r|*") as tar:
        for member in tar:
            if not member.isfile() or member.size > _MAX_MEMBER or not _LLAMA_FILES.search(member.name):
                continue
            fh = tar.extractfile(member)
            if fh is None:
                continue
            try:
                s, p = fatbin.fatbin_archs(fh.read())
            except fatbin.NotElf:
                continue
            read.append(member.name)
            sass.update(s)
            ptx.update(p)
    key = lambda c: tuple(int(x) for x in c.split("."))  # noqa: E731
    return sorted(sass, key=key), sorted(ptx, key=key), read


CUDA_LABEL = "io.llmfleet.cuda-version"


def image_cuda(config: dict[str, Any]) -> str | None:
    """The image's CUDA from the nvidia/cuda bases' ``CUDA_VERSION`` environment variable, else from the
    ``io.llmfleet.cuda-version`` label (images built without CUDA_VERSION, which would make the NVIDIA
    runtime require that CUDA of the driver: dockerfiles/llamacpp-cu118)."""
    for v in ((config.get("env") or {}).get("CUDA_VERSION"), (config.get("labels") or {}).get(CUDA_LABEL)):
        if v and re.fullmatch(r"\d+\.\d+(\.\d+)?", v):
            return v
    return None


def apply(entry: LockedImage, ins: Inspection, *, keep_cuda_when_unknown: bool = True) -> LockedImage:
    """The lock entry with the inspected facts in place and ``archs_source: inspected``. Pure."""
    return replace(
        entry,
        cuda=ins.cuda or (entry.cuda if keep_cuda_when_unknown else None),
        archs=ins.archs,
        torch=ins.torch,
        torch_cuda=ins.torch_cuda,
        torch_archs=ins.torch_archs,
        archs_source="inspected",
        engine_version=ins.engine_version,
        require_cuda=ins.require_cuda,
    )


# ------------------------------------------------------------------------------------------------
# Shell


def _run_default(argv: list[str], timeout: float) -> tuple[int, bytes, bytes]:
    import subprocess

    try:
        res = subprocess.run(argv, capture_output=True, timeout=timeout, check=False)
    except FileNotFoundError:
        raise CheckFailed(f"{argv[0]} not found: images.inspect runs the image with Docker") from None
    except subprocess.TimeoutExpired:
        raise CheckFailed(f"`{' '.join(argv[:4])} ...` took longer than {timeout:.0f} s") from None
    return res.returncode, res.stdout, res.stderr


@dataclass
class _Ctx:
    run: Runner
    docker: str
    notes: list[str] = field(default_factory=list)


def inspect_image(key: str, ref: str, *, runner: Runner | None = None, docker: str = "docker") -> Inspection:
    """Run the image once, without a GPU and without network, and read what it carries."""
    ctx = _Ctx(runner or _run_default, docker)
    engine = key.split(":", 1)[0]
    rc, out, err = ctx.run(config_argv(ref, docker), 60)
    if rc != 0:
        raise CheckFailed(f"images.inspect {key}: image {ref} is not here ({_tail(err)}); pull it first "
                          "(docker pull, or --pull)")
    config = parse_config(out.decode("utf-8", "replace"))
    cuda = image_cuda(config)
    from llmfleet.knowledge.engines import for_engine

    require = (config.get("env") or {}).get("NVIDIA_REQUIRE_CUDA") or None
    if for_engine(engine).inspect_method == "python":
        ins = _inspect_vllm(ctx, key, ref, cuda, engine)
    else:
        ins = _inspect_llamacpp(ctx, key, ref, cuda, config, engine)
    return replace(ins, require_cuda=require)


def _inspect_vllm(ctx: _Ctx, key: str, ref: str, cuda: str | None, engine: str) -> Inspection:
    rc, out, err = ctx.run(vllm_argv(ref, ctx.docker), TIMEOUT_S)
    data = parse_vllm_probe(out.decode("utf-8", "replace"))
    notes = []
    if data.get("torch_error"):
        notes.append(f"torch did not import: {data['torch_error']}")
    if data.get("torch") and not data.get("torch_cuda"):
        notes.append(f"torch {data['torch']} is a CPU build: no CUDA kernels")
    libs = data.get("engine_libs") or []
    if not libs:
        notes.append("no fatbin in vLLM's compiled extensions (a CPU build, or none found)")
    return Inspection(
        key=key, ref=ref, engine=engine, engine_version=data.get("vllm"), cuda=cuda,
        torch=data.get("torch"), torch_cuda=data.get("torch_cuda"),
        torch_archs=torch_archs_from_flags(data.get("torch_arch_flags")),
        archs=tuple(fatbin.lock_archs(list(data.get("engine_sass") or []), list(data.get("engine_ptx") or []))),
        files=tuple(libs), notes=tuple(notes),
    )


def _inspect_llamacpp(ctx: _Ctx, key: str, ref: str, cuda: str | None, config: dict[str, Any],
                      engine: str) -> Inspection:
    entry = (config.get("entrypoint") or ["/app/llama-server"])[0]
    folder = str(Path(entry).parent) if entry.startswith("/") else "/app"
    rc, out, err = ctx.run(create_argv(ref, ctx.docker), 60)
    if rc != 0:
        raise CheckFailed(f"images.inspect {key}: docker create {ref} failed: {_tail(err)}")
    cid = out.decode().strip()
    try:
        rc, tar_bytes, err = ctx.run(copy_argv(cid, folder, ctx.docker), TIMEOUT_S)
        if rc != 0:
            raise CheckFailed(f"images.inspect {key}: cannot copy {folder} out of the image: {_tail(err)}")
        sass, ptx, files = archs_in_tar(tar_bytes)
    finally:
        ctx.run(remove_argv(cid, ctx.docker), 60)
    rc, vout, verr = ctx.run(llama_version_argv(ref, ctx.docker), 120)
    version = parse_llama_version((vout + verr).decode("utf-8", "replace"))
    notes = [] if (sass or ptx) else [f"no CUDA kernels in {folder} (a CPU build)"]
    return Inspection(key=key, ref=ref, engine=engine, engine_version=version, cuda=cuda,
                      archs=tuple(fatbin.lock_archs(sass, ptx)), files=tuple(files), notes=tuple(notes))


def _tail(err: bytes) -> str:
    lines = err.decode("utf-8", "replace").strip().splitlines()
    return lines[-1][:200] if lines else "no output"
