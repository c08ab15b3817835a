"""A Dockerfile linter for the images llmfleet builds. Pure: text in, findings out.

Two profiles:
- ``fleet``: images that run on fleet hosts (a ``dockerfiles/NAME/`` with an ``image.yaml``). Every
  rule applies: bases pinned by digest, a non-root USER, a HEALTHCHECK, source clones checked
  against a commit, plus the general rules.
- ``local``: images built on this machine from a locally made base (the lab). The general rules
  only: no ``latest``, no unverified downloads, apt and pip hygiene, no secrets, exec-form
  ENTRYPOINT/CMD.

A rule can be waived for a whole file with a comment that says why::

    # lint-ignore DF008: the server has no HTTP endpoint; the deploy health check probes it

A waiver without a reason is itself a finding.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from llmfleet.images.registry import split_reference

RULES: dict[str, tuple[str, str]] = {
    # id: (profile, summary)
    "DF001": ("fleet", "every base image is pinned by digest (@sha256:..., or @${ARG} with the ARG required)"),
    "DF002": ("all", "no `latest` and no untagged base images"),
    "DF003": ("all", "ADD of a URL needs --checksum=sha256:...; prefer COPY for local files"),
    "DF004": ("all", "apt-get install uses --no-install-recommends"),
    "DF005": ("all", "a RUN that runs apt-get update/install removes /var/lib/apt/lists in the same layer"),
    "DF006": ("all", "no apt-get upgrade / dist-upgrade (not reproducible; take a newer pinned base)"),
    "DF007": ("fleet", "the final stage runs as a non-root USER"),
    "DF008": ("fleet", "the final stage has a HEALTHCHECK (or a lint-ignore saying why not)"),
    "DF009": ("all", "no downloading a script into a shell (curl ... | sh)"),
    "DF010": ("all", "no secrets in ENV or ARG (they stay in the image history)"),
    "DF011": ("all", "ENTRYPOINT and CMD in exec (JSON) form, so signals reach the server"),
    "DF012": ("all", "pip install uses --no-cache-dir"),
    "DF013": ("fleet", "a git clone is checked against a commit (git rev-parse / checkout of a SHA or COMMIT arg)"),
    "DF014": ("all", "a lint-ignore names a known rule and gives a reason"),
}

_WAIVER_RE = re.compile(r"^#\s*lint-ignore\s+([A-Z]{2}\d{3})\s*(?::\s*(.*))?$")
_DIGEST_RE = re.compile(r"@sha256:[0-9a-f]{64}$")
_SECRET_RE = re.compile(r"(TOKEN|PASSWORD|PASSWD|SECRET|API_KEY|APIKEY|PRIVATE_KEY|CREDENTIALS?)$", re.I)
_VAR_RE = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}?")


@dataclass(frozen=True)
class Finding:
    path: str
    line: int
    rule: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.rule} {self.message}"

    def to_dict(self) -> dict[str, object]:
        return {"path": self.path, "line": self.line, "rule": self.rule, "message": self.message}


@dataclass(frozen=True)
class Instruction:
    line: int  # 1-based line where it starts
    cmd: str  # upper-case keyword
    args: str  # the rest, continuation lines joined with spaces, comments inside removed


def parse(text: str) -> tuple[list[Instruction], list[tuple[int, str]]]:
    """Instructions (continuations joined) and comment lines (line number, text)."""
    instructions: list[Instruction] = []
    comments: list[tuple[int, str]] = []
    buf: list[str] = []
    start = 0
    for no, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if stripped.startswith("#"):
            comments.append((no, stripped))
            continue
        if not buf and not stripped:
            continue
        if not buf:
            start = no
        if stripped.endswith("\\"):
            buf.append(stripped[:-1].strip())
            continue
        buf.append(stripped)
        joined = " ".join(p for p in buf if p)
        buf = []
        cmd, _, args = joined.partition(" ")
        instructions.append(Instruction(start, cmd.upper(), args.strip()))
    if buf:
        joined = " ".join(p for p in buf if p)
        cmd, _, args = joined.partition(" ")
        instructions.append(Instruction(start, cmd.upper(), args.strip()))
    return instructions, comments


def _expand(text: str, args: dict[str, str | None]) -> tuple[str, list[str]]:
    """Substitute ARG defaults; returns the text and the names that had no value."""
    unset: list[str] = []

    def sub(m: re.Match) -> str:
        name, fallback = m.group(1), m.group(2)
        value = args.get(name)
        if value is None:
            if fallback is not None:
                return fallback
            unset.append(name)
            return "${" + name + "}"
        return value

    return _VAR_RE.sub(sub, text), unset


def _arg_decl(args: str) -> tuple[str, str | None]:
    name, eq, value = args.partition("=")
    value = value.strip()
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        value = value[1:-1]
    return name.strip(), (value if eq else None)


def lint(text: str, path: str = "Dockerfile", profile: str = "fleet") -> list[Finding]:
    """Findings for one Dockerfile, sorted by line. ``profile`` is ``fleet`` or ``local``."""
    if profile not in ("fleet", "local"):
        raise ValueError(f"unknown profile {profile!r}")
    instructions, comments = parse(text)
    findings: list[Finding] = []

    def add(line: int, rule: str, message: str) -> None:
        findings.append(Finding(path, line, rule, message))

    waived: set[str] = set()
    for no, comment in comments:
        m = _WAIVER_RE.match(comment)
        if comment.lower().startswith("# lint-ignore") or comment.lower().startswith("#lint-ignore"):
            if not m or m.group(1) not in RULES or not (m.group(2) or "").strip():
                add(no, "DF014", "lint-ignore needs a known rule id and a reason: `# lint-ignore DF008: why`")
            else:
                waived.add(m.group(1))

    global_args: dict[str, str | None] = {}
    stage_args: dict[str, str | None] = {}
    stages: list[str] = []
    seen_from = False
    final: dict[str, Instruction | None] = {"USER": None, "HEALTHCHECK": None}
    for ins in instructions:
        if ins.cmd == "ARG":
            name, value = _arg_decl(ins.args)
            (stage_args if seen_from else global_args)[name] = value
            if _SECRET_RE.search(name):
                add(ins.line, "DF010", f"ARG {name} looks like a secret; build args stay in the image history "
                                       "(use a BuildKit secret mount or pass it at run time)")
            continue
        if ins.cmd == "FROM":
            seen_from = True
            stage_args = {}
            final = {"USER": None, "HEALTHCHECK": None}
            words = [w for w in ins.args.split() if not w.startswith("--")]
            ref_raw = words[0] if words else ""
            prior = list(stages)
            if len(words) >= 3 and words[1].lower() == "as":
                stages.append(words[2].lower())
            ref, unset = _expand(ref_raw, global_args)
            if ref_raw.lower() == "scratch" or ref.lower() in prior:
                continue
            name, tag, digest = split_reference(ref)
            digest_raw = ref_raw.split("@", 1)[1] if "@" in ref_raw else None
            digest_var = _VAR_RE.match(digest_raw) if digest_raw else None
            required_digest_arg = bool(digest_raw and re.fullmatch(r"\$\{?[A-Za-z_][A-Za-z0-9_]*\}?", digest_raw)
                                       and digest_var and digest_var.group(1) in unset)
            pinned = bool(digest and _DIGEST_RE.search("@" + digest)) or required_digest_arg
            if not pinned:
                add(ins.line, "DF001", f"base {ref_raw} is not pinned by digest; write "
                                       f"{name}:{tag or 'TAG'}@sha256:... or @${{BASE_DIGEST}} with a required ARG")
            if unset and not (required_digest_arg and digest_var and unset == [digest_var.group(1)]):
                continue  # set by the build (e.g. a locally built base); nothing more to judge
            if tag == "latest" or (tag is None and digest is None):
                add(ins.line, "DF002", f"base {ref} floats ({'latest' if tag else 'no tag'}); name a version tag")
            continue
        if ins.cmd == "ADD":
            srcs = [w for w in ins.args.split() if not w.startswith("--")][:-1]
            has_checksum = "--checksum=" in ins.args
            for src in srcs:
                if re.match(r"^(https?|ftp)://", src) and not has_checksum:
                    add(ins.line, "DF003", f"ADD {src} without --checksum=sha256:...: the download is not verified")
                elif not re.match(r"^(https?|ftp|git@)", src) and not src.endswith((".tar", ".tar.gz", ".tgz",
                                                                                      ".tar.xz", ".tar.bz2")):
                    add(ins.line, "DF003", f"ADD {src}: use COPY for local files (ADD also unpacks and fetches)")
            continue
        if ins.cmd == "RUN":
            run = ins.args
            if re.search(r"\bapt(-get)?\s+(-\S+\s+)*install\b", run) and "--no-install-recommends" not in run:
                add(ins.line, "DF004", "apt-get install without --no-install-recommends pulls in unneeded packages")
            if re.search(r"\bapt(-get)?\s+(-\S+\s+)*(update|install)\b", run) and "/var/lib/apt/lists" not in run:
                add(ins.line, "DF005", "apt lists left in the layer; end the RUN with `&& rm -rf /var/lib/apt/lists/*`")
            if re.search(r"\bapt(-get)?\s+(-\S+\s+)*(upgrade|dist-upgrade|full-upgrade)\b", run):
                add(ins.line, "DF006", "apt-get upgrade makes the image depend on the day it was built")
            if re.search(r"\b(curl|wget)\b[^|;&]*\|\s*(sudo\s+)?(ba|z|da)?sh\b", run):
                add(ins.line, "DF009", "a downloaded script is piped into a shell without verification")
            if re.search(r"\bpip3?\s+install\b", run) and "--no-cache-dir" not in run and "PIP_NO_CACHE_DIR" not in run:
                add(ins.line, "DF012", "pip install without --no-cache-dir leaves the wheel cache in the layer")
            if re.search(r"\bgit\s+clone\b", run) and not re.search(
                r"rev-parse|git\s+(-C\s+\S+\s+)?checkout\s+(\"?\$\{?\w*COMMIT\w*\}?\"?|[0-9a-f]{40})", run
            ):
                add(ins.line, "DF013", "git clone of a branch or tag is not checked against a commit SHA")
            continue
        if ins.cmd == "ENV":
            names = re.findall(r"(?:^|\s)([A-Za-z_][A-Za-z0-9_]*)=", ins.args) or ins.args.split()[:1]
            for n in names:
                if _SECRET_RE.search(n):
                    add(ins.line, "DF010", f"ENV {n} looks like a secret baked into the image; pass it at run time")
            continue
        if ins.cmd in ("ENTRYPOINT", "CMD"):
            try:
                ok = isinstance(json.loads(ins.args), list)
            except ValueError:
                ok = False
            if not ok:
                add(ins.line, "DF011", f"{ins.cmd} in shell form: the server will not get SIGTERM; use [\"prog\", \"arg\"]")
            continue
        if ins.cmd in final:
            final[ins.cmd] = ins

    if profile == "fleet" and seen_from:
        last_line = instructions[-1].line if instructions else 1
        user = final["USER"]
        if user is None:
            add(last_line, "DF007", "the final stage runs as root; add a system user and `USER name`")
        else:
            who = user.args.split(":", 1)[0].strip()
            if who in ("root", "0"):
                add(user.line, "DF007", "USER root: run the server as an unprivileged user")
        hc = final["HEALTHCHECK"]
        if hc is None or hc.args.strip().upper() == "NONE":
            add(hc.line if hc else last_line, "DF008",
                "no HEALTHCHECK: add one (e.g. CMD [\"curl\", \"-fsS\", \"http://127.0.0.1:PORT/health\"]) or say why not")

    out = [f for f in findings
           if f.rule not in waived and (profile == "fleet" or RULES[f.rule][0] == "all")]
    return sorted(out, key=lambda f: (f.line, f.rule))


def profile_for(dockerfile: Path) -> str:
    """``fleet`` for an image with an image.yaml next to it (it runs on fleet hosts), else ``local``."""
    return "fleet" if (dockerfile.parent / "image.yaml").is_file() else "local"


def lint_tree(root: Path) -> list[Finding]:
    """Lint every ``Dockerfile`` (and ``*.Dockerfile``) under ``root``; I/O at the edge only."""
    findings: list[Finding] = []
    files = sorted({*root.rglob("Dockerfile"), *root.rglob("*.Dockerfile")})
    for f in files:
        rel = str(f.relative_to(root.parent)) if root.parent in f.parents else str(f)
        findings += lint(f.read_text(encoding="utf-8"), rel, profile_for(f))
    return findings


# ------------------------------------------------------------------------------------------------
# What a Dockerfile says about the image it builds (checked against catalog/engines.yaml by tests)

ARCH_ARGS = ("CMAKE_CUDA_ARCHITECTURES", "CUDA_ARCHITECTURES", "TORCH_CUDA_ARCH_LIST")


@dataclass(frozen=True)
class Claims:
    cuda: str | None  # ARG CUDA_VERSION default
    arch_arg: str | None  # which ARG carries the architecture list
    sass: tuple[str, ...]
    ptx: tuple[str, ...]
    bases: tuple[tuple[str, str | None], ...]  # (image after ARG defaults, digest build arg or None)
    problems: tuple[str, ...] = ()  # inconsistencies inside the Dockerfile itself


def _cc(text: str) -> str:
    """``"61"`` / ``"6.1"`` / ``"120a"`` -> ``"6.1"`` / ``"12.0a"``."""
    m = re.fullmatch(r"(\d{1,2})\.?(\d)(a?)", text)
    if not m:
        raise ValueError(text)
    return f"{int(m.group(1))}.{m.group(2)}{m.group(3)}"


def parse_arch_list(arg: str, value: str) -> tuple[list[str], list[str]]:
    """An architecture list -> (sass, ptx) compute capabilities.

    CMake (``CMAKE_CUDA_ARCHITECTURES``, ``;``-separated): ``NN-real`` SASS, ``NN-virtual`` PTX, ``NN``
    both. PyTorch (``TORCH_CUDA_ARCH_LIST``, spaces or ``;``): ``X.Y`` SASS, ``X.Y+PTX`` both.
    """
    sass: list[str] = []
    ptx: list[str] = []
    if arg == "TORCH_CUDA_ARCH_LIST":
        for item in re.split(r"[;\s]+", value.strip()):
            if not item:
                continue
            both = item.upper().endswith("+PTX")
            cc = _cc(item[:-4] if both else item)
            sass.append(cc)
            if both:
                ptx.append(cc)
        return sass, ptx
    for item in re.split(r"[;\s]+", value.strip()):
        if not item:
            continue
        base, _, kind = item.partition("-")
        cc = _cc(base)
        if kind in ("", "real"):
            sass.append(cc)
        if kind in ("", "virtual"):
            ptx.append(cc)
        if kind not in ("", "real", "virtual"):
            raise ValueError(item)
    return sass, ptx


def claims(text: str) -> Claims:
    """CUDA version, kernels and bases a Dockerfile builds with (ARG defaults applied). Pure."""
    instructions, _ = parse(text)
    global_args: dict[str, str | None] = {}
    arch_defaults: dict[str, set[str]] = {}
    bases: list[tuple[str, str | None]] = []
    stages: list[str] = []
    problems: list[str] = []
    used: set[str] = set()
    seen_from = False
    for ins in instructions:
        if ins.cmd == "ARG":
            name, value = _arg_decl(ins.args)
            if not seen_from:
                global_args[name] = value
            if name in ARCH_ARGS and value is not None:
                arch_defaults.setdefault(name, set()).add(value)
        elif ins.cmd == "FROM":
            seen_from = True
            words = [w for w in ins.args.split() if not w.startswith("--")]
            ref_raw = words[0] if words else ""
            prior = list(stages)
            if len(words) >= 3 and words[1].lower() == "as":
                stages.append(words[2].lower())
            if ref_raw.lower() == "scratch" or ref_raw.lower() in prior:
                continue
            image_part, _, digest_part = ref_raw.partition("@")
            image, _ = _expand(image_part, global_args)
            m = _VAR_RE.fullmatch(digest_part) if digest_part else None
            bases.append((image, m.group(1) if m else None))
        elif ins.cmd in ("RUN", "ENV"):
            passes = re.search(r"CMAKE_CUDA_ARCHITECTURES|TORCH_CUDA_ARCH_LIST\s*=", ins.args)
            used.update(n for n in ARCH_ARGS if passes and re.search(rf"\$\{{?{n}\b", ins.args))
    arch_arg = next((a for a in ARCH_ARGS if a in arch_defaults), None)
    sass: list[str] = []
    ptx: list[str] = []
    if arch_arg:
        values = arch_defaults[arch_arg]
        if len(values) > 1:
            problems.append(f"ARG {arch_arg} has different defaults in different stages: {sorted(values)}")
        try:
            sass, ptx = parse_arch_list(arch_arg, sorted(values)[0])
        except ValueError as exc:
            problems.append(f"ARG {arch_arg}: cannot read architecture {exc}")
        if arch_arg not in used:
            problems.append(f"ARG {arch_arg} is declared but never passed to the build (cmake or TORCH_CUDA_ARCH_LIST=)")
    return Claims(cuda=global_args.get("CUDA_VERSION"), arch_arg=arch_arg, sass=tuple(sass), ptx=tuple(ptx),
                  bases=tuple(bases), problems=tuple(problems))


def mismatches(c: Claims, release: dict) -> list[str]:
    """How a Dockerfile's claims differ from its catalog entry (``cuda``, ``kernels.sass/ptx``). Pure."""
    out = list(c.problems)
    if str(release.get("cuda")) != str(c.cuda):
        out.append(f"CUDA: catalog {release.get('cuda')}, Dockerfile ARG CUDA_VERSION={c.cuda}")
    kernels = release.get("kernels") or {}
    for kind, have in (("sass", c.sass), ("ptx", c.ptx)):
        want = sorted(str(a) for a in kernels.get(kind) or [])
        if sorted(have) != want:
            out.append(f"{kind}: catalog {want}, Dockerfile {c.arch_arg}={sorted(have)}")
    return out
