"""Every remote script of a model push, each beside the parser of its output (as release/store.py).

Hosts need only ``sh``, coreutils (``stat``, ``sha256sum``, ``truncate``, ``df``, ``mv``, ``chmod``) and
``python3`` (which writes the manifest); no rsync. Layout beside ``model_path`` (same filesystem, so the
final ``mv`` is a rename)::

    X                      the model (a file, or a folder D)
    X.llmfleet.json        its manifest (knowledge/model_manifest.py), written after sha256sum agreed
    X.llmfleet.part        the staging copy being received (a file, or a folder for a folder model)
    X.llmfleet.part.want   which content the staging copy is for (the wanted manifest's content digest)
    X.llmfleet.part.owner  which push fills it now: the token of the deploy lock that push holds

A half-received file only ever sits in the staging copy; ``commit_script`` renames it into place. A
push writes the staging copy only while it holds the host's deploy lock, and every write and the
commit first check the owner stamp (``@@staging-taken OWNER``, exit 5): a push whose staging copy
another writer took (the lock broken under it, a hand ``rm``) stops, and never touches the other's bytes.

Pure: every builder returns a POSIX sh script with each value ``shlex.quote``-d; tests/golden/scripts/
pins their text. Scripts print ``@@`` lines only the parsers here read.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Any, Literal

from llmfleet.knowledge import model_manifest as M

q = shlex.quote
MAX_TREE_FILES = M.MAX_FILES
MAX_DEPTH = 8

# The model reader: one shell function, sent before the probe (host/probe) and inside the push's own
# probe. Prints the model's kind, its manifest between begin/end lines (capped), and size and mtime of
# every regular file of the model (symlinks followed, as the engine's container follows them).
MANIFEST_READER = r"""llmfleet_model_tree() {
    # DIR DEPTH: "@@file SIZE MTIME REL" per regular file under DIR (REL from $LLM_TOP)
    [ "$2" -le 8 ] || return 0
    for llm_f in "$1"/* "$1"/.[!.]* "$1"/..?*; do
        [ -e "$llm_f" ] || continue
        [ "$LLM_N" -lt 10000 ] || { echo "@@tree-cut"; return 0; }
        if [ -d "$llm_f" ]; then
            llmfleet_model_tree "$llm_f" $(($2 + 1))
        elif [ -f "$llm_f" ]; then
            LLM_N=$((LLM_N + 1))
            printf '@@file %s %s\n' "$(stat -L -c '%s %Y' -- "$llm_f" 2>/dev/null)" "${llm_f#"$LLM_TOP"/}"
        fi
    done
}
llmfleet_model_manifest() {
    # MODEL_PATH: the model's kind, its manifest, its files' size and mtime
    llm_p=$1
    LLM_N=0
    if [ -d "$llm_p" ]; then
        echo "@@kind dir"
        LLM_TOP=$llm_p
        llmfleet_model_tree "$llm_p" 1
    elif [ -f "$llm_p" ]; then
        echo "@@kind file"
        printf '@@file %s %s\n' "$(stat -L -c '%s %Y' -- "$llm_p" 2>/dev/null)" "${llm_p##*/}"
    elif [ -e "$llm_p" ]; then
        echo "@@kind other"
    else
        echo "@@kind missing"
    fi
    if [ -f "$llm_p.llmfleet.json" ]; then
        echo "@@manifest begin"
        head -c 4194305 -- "$llm_p.llmfleet.json" 2>&1
        echo
        echo "@@manifest end"
    else
        echo "@@manifest none"
    fi
}
"""


def reader_call(model_path: str) -> str:
    """The reader run on one model path (after ``MANIFEST_READER`` defined it)."""
    return f"llmfleet_model_manifest {q(model_path.rstrip('/') or '/')}"


@dataclass
class HostModel:
    """What the reader printed for one model path."""

    model_path: str
    kind: Literal["file", "dir", "other", "missing", "unknown"] = "unknown"
    manifest_text: str | None = None  # None: the host has no manifest file
    files: dict[str, tuple[int, int]] = field(default_factory=dict)  # rel -> (size, mtime) now
    cut: bool = False  # the file listing was cut (over MAX_TREE_FILES)
    read: bool = False  # the reader's output was found at all

    def manifest(self) -> tuple[M.Manifest | None, list[str]]:
        return M.parse(self.manifest_text)


def _file_line(line: str) -> tuple[str, int, int] | None:
    parts = line[len("@@file "):].split(" ", 2)
    if len(parts) != 3 or not parts[0].isdigit() or not parts[1].lstrip("-").isdigit() or not parts[2]:
        return None
    return parts[2], int(parts[0]), int(parts[1])


def parse_reader(stdout: str, model_path: str) -> HostModel:
    """The reader's output -> ``HostModel``. Never raises; unknown lines are ignored."""
    hm = HostModel(model_path=model_path)
    lines = stdout.split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("@@kind "):
            hm.read = True
            kind = line[7:].strip()
            hm.kind = kind if kind in ("file", "dir", "other", "missing") else "unknown"  # type: ignore[assignment]
        elif line.startswith("@@file "):
            got = _file_line(line)
            if got is not None and len(hm.files) < MAX_TREE_FILES:
                hm.files[got[0]] = (got[1], got[2])
        elif line == "@@tree-cut":
            hm.cut = True
        elif line == "@@manifest begin":
            end = len(lines) - 1
            while end > i and lines[end] != "@@manifest end":
                end -= 1
            if end > i:
                body = "\n".join(lines[i + 1:end])
                hm.manifest_text = body[:-1] if body.endswith("\n") else body
                i = end
            else:
                hm.manifest_text = "\n".join(lines[i + 1:])
                i = len(lines)
        i += 1
    return hm


# ---------------------------------------------------------------------------------------------
# The push's probe: one round trip per host


@dataclass
class PushProbe:
    """What one host holds for one model path: the model and its manifest, the staging copy (resume
    points), free space on the filesystem that will hold the model, and the tools the push needs."""

    model: HostModel
    part_kind: Literal["file", "dir", "none"] = "none"
    parts: dict[str, int] = field(default_factory=dict)  # rel -> bytes already received
    want: str | None = None  # the staging copy's stamp (the content digest it is being filled for)
    fs_path: str | None = None  # the nearest existing folder of model_path (what df read)
    free_bytes: int | None = None
    tools: dict[str, bool] = field(default_factory=dict)
    complete: bool = False  # the probe ran to its end

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.model.kind, "manifest": self.model.manifest_text is not None,
                "files": len(self.model.files), "parts": dict(self.parts), "free_bytes": self.free_bytes,
                "fs_path": self.fs_path, "tools": dict(self.tools)}


PROBE_TOOLS = ("sha256sum", "python3", "stat", "truncate")


def probe_script(model_path: str) -> str:
    """The model (``MANIFEST_READER``), the staging copy and its stamp, free space where the model goes
    (``df -Pk`` of the nearest existing folder), the tools: read-only, one round trip."""
    mp = model_path.rstrip("/") or "/"
    part, want = M.part_path(mp), M.want_path(mp)
    return "\n".join([
        MANIFEST_READER.rstrip("\n"),
        reader_call(mp),
        f"part={q(part)}",
        'if [ -d "$part" ]; then',
        '    echo "@@part-kind dir"',
        '    LLM_N=0',
        '    LLM_TOP=$part',
        '    llmfleet_model_tree "$part" 1 | while IFS= read -r l; do printf \'@@part %s\\n\' "${l#@@file }"; done',
        'elif [ -f "$part" ]; then',
        '    echo "@@part-kind file"',
        f"    printf '@@part %s %s\\n' \"$(stat -c '%s %Y' -- \"$part\")\" {q(mp.rsplit('/', 1)[-1])}",
        'else',
        '    echo "@@part-kind none"',
        'fi',
        f'if [ -f {q(want)} ]; then echo "@@want $(head -c 200 -- {q(want)})"; fi',
        f"d={q(mp)}",
        'while [ -n "$d" ] && [ ! -d "$d" ]; do d=${d%/*}; done',
        '[ -n "$d" ] || d=/',
        'echo "@@fs $d"',
        'df -Pk -- "$d" 2>/dev/null | tail -n 1 | while read -r _fs _total _used avail _rest; do echo "@@avail-kib $avail"; done',
        f"for t in {' '.join(PROBE_TOOLS)}; do",
        '    if command -v "$t" >/dev/null 2>&1; then echo "@@tool $t yes"; else echo "@@tool $t no"; fi',
        'done',
        'echo "@@probe-done"',
    ])


def parse_probe(stdout: str, model_path: str) -> PushProbe:
    """``probe_script``'s output -> ``PushProbe``. Never raises."""
    mp = model_path.rstrip("/") or "/"
    model_lines, rest = [], []
    in_manifest = False
    for line in stdout.split("\n"):
        # the manifest's own lines belong to the reader, whatever they say
        if line == "@@manifest begin":
            in_manifest = True
        if in_manifest or not line.startswith(("@@part", "@@want", "@@fs", "@@avail-kib", "@@tool", "@@probe-done")):
            model_lines.append(line)
        else:
            rest.append(line)
        if line == "@@manifest end":
            in_manifest = False
    pp = PushProbe(model=parse_reader("\n".join(model_lines), mp))
    for line in rest:
        if line.startswith("@@part-kind "):
            k = line[12:].strip()
            pp.part_kind = k if k in ("file", "dir") else "none"  # type: ignore[assignment]
        elif line.startswith("@@part "):
            got = _file_line("@@file " + line[7:])
            if got is not None and len(pp.parts) < MAX_TREE_FILES:
                pp.parts[got[0]] = got[1]
        elif line.startswith("@@want "):
            pp.want = line[7:].strip() or None
        elif line.startswith("@@fs "):
            pp.fs_path = line[5:]
        elif line.startswith("@@avail-kib "):
            v = line[12:].strip()
            pp.free_bytes = int(v) * 1024 if v.isdigit() else None
        elif line.startswith("@@tool "):
            parts = line.split()
            if len(parts) == 3:
                pp.tools[parts[1]] = parts[2] == "yes"
        elif line == "@@probe-done":
            pp.complete = True
    return pp


# ---------------------------------------------------------------------------------------------
# Receiving: append to a staging file from a resume point


RESUME_LOST_RC = 4
STAGING_TAKEN_RC = 5


def _owner_test(owner_file: str, token: str) -> str:
    """sh: exit 5 with ``@@staging-taken OWNER`` (``none``: no stamp) unless ``owner_file`` holds ``token``."""
    return (f"o=$(head -c 64 -- {q(owner_file)} 2>/dev/null); "
            f"if [ \"$o\" != {q(token)} ]; then echo \"@@staging-taken ${{o:-none}}\"; exit {STAGING_TAKEN_RC}; fi")


def receive_script(dest_part: str, offset: int, owner: tuple[str, str] | None = None) -> str:
    """Append stdin to ``dest_part`` from byte ``offset`` (its folder made as needed, mode 0644 under
    umask 022): at 0 the file is emptied first; else it must hold at least ``offset`` bytes (cut back
    to exactly that: bytes past the resume point are dropped), or the script exits 4 without writing
    (``@@resume-lost SIZE``). Prints ``@@received SIZE`` (the file's size after). One line: it is also
    the forced command of a one-use key (host-to-host copies).

    ``owner`` (the owner stamp's path, this push's token): before writing, the stamp must name this
    push, and after, it still must and ``dest_part`` must be the file written to (same inode); else
    ``@@staging-taken OWNER`` and exit 5: another writer took the staging copy."""
    off = int(offset)
    if off < 0:
        raise ValueError(f"offset {offset} is negative")
    p = q(dest_part)
    d = q(dest_part.rsplit("/", 1)[0] or "/")
    if off == 0:
        start = f": > {p} || exit 1"
    else:
        start = (f"have=$(stat -c %s -- {p} 2>/dev/null) || have=-1; "
                 f"if [ \"$have\" -lt {off} ]; then echo \"@@resume-lost $have\"; exit {RESUME_LOST_RC}; fi; "
                 f"if [ \"$have\" -gt {off} ]; then truncate -s {off} -- {p} || exit 1; fi")
    if owner is None:
        return (f"umask 022; mkdir -p -- {d} || exit 1; {start}; cat >> {p}; rc=$?; "
                f"echo \"@@received $(stat -c %s -- {p} 2>/dev/null)\"; exit $rc")
    check = _owner_test(*owner)
    return (f"umask 022; mkdir -p -- {d} || exit 1; {check}; {start}; i=$(stat -c %i -- {p}); cat >> {p}; rc=$?; "
            f"{check}; if [ \"$(stat -c %i -- {p} 2>/dev/null)\" != \"$i\" ]; then echo '@@staging-taken replaced'; "
            f"exit {STAGING_TAKEN_RC}; fi; echo \"@@received $(stat -c %s -- {p} 2>/dev/null)\"; exit $rc")


def owner_check_script(model_path: str, token: str, lock_holder: str) -> str:
    """The first step of a commit: the staging copy is still this push's (its owner stamp holds
    ``token``), else ``@@staging-taken OWNER``; and the host's deploy lock is still this push's (its
    holder document ``lock_holder`` names ``token``), else ``@@lock-lost`` (the lock was broken under
    the push). Either exits 5 before anything is checked, moved or removed."""
    return "\n".join([
        _owner_test(M.owner_path(model_path.rstrip("/") or "/"), token),
        f"grep -qF -- {q(token)} {q(lock_holder)} 2>/dev/null || {{ echo '@@lock-lost'; exit {STAGING_TAKEN_RC}; }}",
    ])


def parse_lock_lost(stdout: str) -> bool:
    return "@@lock-lost" in stdout.splitlines()


def parse_staging_taken(stdout: str) -> str | None:
    """Who holds the staging copy now, when a push's own step found it taken: the owner stamp's
    token, ``none`` (no stamp: removed), ``replaced`` (the file written to is no longer there);
    None when the step found the copy still its own."""
    for line in stdout.splitlines():
        if line.startswith("@@staging-taken"):
            return line[15:].strip() or "none"
    return None


def parse_received(stdout: str) -> int | None:
    """The staging file's size after a receive (None: not printed)."""
    for line in reversed(stdout.splitlines()):
        if line.startswith("@@received "):
            v = line[11:].strip()
            return int(v) if v.isdigit() else None
    return None


def parse_resume_lost(stdout: str) -> int | None:
    for line in stdout.splitlines():
        if line.startswith("@@resume-lost "):
            v = line[14:].strip()
            return int(v) if v.lstrip("-").isdigit() else -1
    return None


# ---------------------------------------------------------------------------------------------
# Staging, verifying, committing


def staging_file(model_path: str, kind: str, rel: str) -> str:
    """Where file ``rel`` of the model is received: the staging file itself, or inside the staging folder."""
    part = M.part_path(model_path)
    return part if kind == "file" else f"{part}/{rel}"


def prepare_script(model_path: str, kind: str, digest: str, *, reset: bool, link: tuple[str, ...] = (),
                   owner: str | None = None) -> str:
    """Before sending: with ``reset`` drop the staging copy (it was for other content, or there is
    none), then stamp it with the content ``digest`` it is filled for; the model's folder made.
    ``link``: files of a folder model the host already holds verified (sha256sum just agreed), hard
    linked into the staging folder instead of being sent again. ``owner``: the token of the deploy
    lock the push holds, written to the owner stamp (the staging copy is this push's from now on)."""
    mp = model_path.rstrip("/") or "/"
    part, want = M.part_path(mp), M.want_path(mp)
    lines = ["umask 022", f"mkdir -p -- {q(mp.rsplit('/', 1)[0] or '/')} || exit 1"]
    if reset:
        lines.append(f"rm -rf -- {q(part)} {q(want)} {q(M.owner_path(mp))} || exit 1")
    if kind == "dir":
        lines.append(f"mkdir -p -- {q(part)} || exit 1")
        for rel in link:
            dest = f"{part}/{rel}"
            lines.append(f"mkdir -p -- {q(dest.rsplit('/', 1)[0])} && ln -f -- {q(mp + '/' + rel)} {q(dest)} || exit 1")
    lines.append(f"printf '%s\\n' {q(digest)} > {q(want)} || exit 1")
    if owner is not None:
        lines.append(f"printf '%s\\n' {q(owner)} > {q(M.owner_path(mp))} || exit 1")
    lines.append("echo @@prepared")
    return "\n".join(lines)


def parse_prepared(stdout: str) -> bool:
    return "@@prepared" in stdout.splitlines()


VERIFY_FAILED_RC = 3


def verify_script(model_path: str, wanted: M.Manifest, *, in_place: bool = False) -> str:
    """``sha256sum`` of every file of the staging copy (``in_place``: of the model itself) against the
    wanted manifest: ``@@sha OK|BAD REL SHA`` per file. A staging file that does not match is removed
    (resuming it would keep its bad bytes); exits 3 when any file does not match. Staging files are
    flushed to disk (``sync``) before they are read."""
    mp = model_path.rstrip("/") or "/"
    lines = ["bad=0"]
    for f in wanted.files:
        path = (mp if wanted.kind == "file" else f"{mp}/{f.path}") if in_place else staging_file(mp, wanted.kind, f.path)
        p = q(path)
        drop = "" if in_place else f"; rm -f -- {p}"
        if not in_place:
            lines.append(f"sync -- {p} 2>/dev/null || true")
        lines.append(f"h=$(sha256sum -- {p} 2>/dev/null | cut -c1-64)")
        lines.append(f"if [ \"$h\" = {q(f.sha256)} ]; then echo \"@@sha OK {f.path} $h\"; "
                     f"else echo \"@@sha BAD {f.path} ${{h:-unreadable}}\"; bad=1{drop}; fi")
    lines.append(f"[ \"$bad\" = 0 ] || exit {VERIFY_FAILED_RC}")
    return "\n".join(lines)


def parse_verify(stdout: str) -> tuple[list[str], dict[str, str]]:
    """(files that matched, {file that did not: the sha256 found or 'unreadable'})."""
    ok: list[str] = []
    bad: dict[str, str] = {}
    for line in stdout.splitlines():
        if line.startswith("@@sha "):
            parts = line.split(" ")
            if len(parts) >= 4:
                rel, got = " ".join(parts[2:-1]), parts[-1]
                if parts[1] == "OK":
                    ok.append(rel)
                else:
                    bad[rel] = got
    return ok, bad


# python3 on the host writes the manifest: the controller's document (stdin) with each file's size and
# mtime as the host sees them now, into a temporary file renamed over the old one, mode 0644.
MANIFEST_WRITER = r"""import json, os, sys
mp, mf = sys.argv[1], sys.argv[2]
doc = json.load(sys.stdin)
for f in doc["files"]:
    st = os.stat(os.path.join(mp, f["path"]) if doc["kind"] == "dir" else mp)
    f["observed"] = {"size": st.st_size, "mtime": int(st.st_mtime)}
tmp = mf + ".tmp"
with open(tmp, "w") as fh:
    fh.write(json.dumps(doc, separators=(",", ":")) + "\n")
os.chmod(tmp, 0o644)
os.replace(tmp, mf)
print("@@manifest-written")
"""


def commit_script(model_path: str, kind: str, *, move: bool = True) -> str:
    """Put the verified staging copy in place and write the manifest (its JSON on stdin).

    The old manifest goes first, so a cut part-way leaves no manifest (a WARN) and never one that
    describes other bytes. A file model is one ``mv`` (rename(2): atomic); a folder model moves the
    old folder aside, the new one in, then removes the old one. Files end 0644 and folders 0755 (the
    engine's container reads them as any user), owned by root when the script runs as root.
    ``move=False``: the model already is the content (verified in place): only the manifest."""
    mp = model_path.rstrip("/") or "/"
    part, want, mf = M.part_path(mp), M.want_path(mp), M.manifest_path(mp)
    lines = ["umask 022", "set -u"]
    if move:
        lines += [
            f"chmod -R u=rwX,go=rX -- {q(part)} || exit 1",
            f"if [ \"$(id -u)\" = 0 ]; then chown -R 0:0 -- {q(part)} || exit 1; fi",
            f"rm -f -- {q(mf)} || exit 1",
        ]
        if kind == "file":
            lines.append(f"mv -fT -- {q(part)} {q(mp)} || exit 1")
        else:
            old = q(mp + ".llmfleet.old")
            lines += [
                f"rm -rf -- {old} || exit 1",
                f"if [ -e {q(mp)} ] || [ -L {q(mp)} ]; then mv -T -- {q(mp)} {old} || exit 1; fi",
                f"mv -T -- {q(part)} {q(mp)} || exit 1",
                f"rm -rf -- {old}",
            ]
        lines.append(f"rm -f -- {q(want)} {q(M.owner_path(mp))}")
    else:
        lines.append(f"rm -f -- {q(mf)} || exit 1")
    lines += [
        f"python3 -c {q(MANIFEST_WRITER)} {q(mp)} {q(mf)} || exit 1",
        f"if [ \"$(id -u)\" = 0 ]; then chown 0:0 -- {q(mf)}; fi",
        "echo @@committed",
    ]
    return "\n".join(lines)


def parse_committed(stdout: str) -> bool:
    lines = stdout.splitlines()
    return "@@committed" in lines and "@@manifest-written" in lines


def cleanup_script(model_path: str) -> str:
    """Drop the staging copy and its stamp (the model and its manifest are left alone)."""
    mp = model_path.rstrip("/") or "/"
    return (f"rm -rf -- {q(M.part_path(mp))} {q(M.want_path(mp))} {q(M.owner_path(mp))} {q(mp + '.llmfleet.old')}"
            "\necho @@cleaned")


def hash_script(model_path: str, kind: str) -> str:
    """Size and ``sha256sum`` of every file of the staging copy (``@@hash SIZE SHA REL``): what a copy
    that no manifest describes yet (a download on the host) holds."""
    mp = model_path.rstrip("/") or "/"
    part = M.part_path(mp)
    if kind == "file":
        return "\n".join([
            f"part={q(part)}",
            "[ -f \"$part\" ] || exit 1",
            f"printf '@@hash %s %s %s\\n' \"$(stat -c %s -- \"$part\")\" \"$(sha256sum -- \"$part\" | cut -c1-64)\" "
            f"{q(mp.rsplit('/', 1)[-1])}",
        ])
    return "\n".join([
        MANIFEST_READER.rstrip("\n"),
        f"part={q(part)}",
        "[ -d \"$part\" ] || exit 1",
        "LLM_N=0",
        "LLM_TOP=$part",
        'llmfleet_model_tree "$part" 1 | while read -r _ size _mtime rel; do',
        "    printf '@@hash %s %s %s\\n' \"$size\" \"$(sha256sum -- \"$part/$rel\" | cut -c1-64)\" \"$rel\"",
        "done",
    ])


def parse_hashes(stdout: str) -> list[tuple[str, int, str]]:
    """``hash_script``'s lines -> [(rel, size, sha256)] (lines that do not parse are left out)."""
    out = []
    for line in stdout.splitlines():
        if line.startswith("@@hash "):
            parts = line[7:].split(" ", 2)
            if len(parts) == 3 and parts[0].isdigit() and len(parts[1]) == 64 and M.check_relpath(parts[2]) is None:
                out.append((parts[2], int(parts[0]), parts[1]))
    return out


# ---------------------------------------------------------------------------------------------
# Downloading on the host from the Hugging Face Hub (model_source: {hf: ..., allow_download: true})

# Run by the image's python3 with huggingface_hub (every vLLM image has it): a pinned revision into the
# staging folder; one file of the repository for a single-file model.
HF_DOWNLOAD = r"""import sys
from huggingface_hub import hf_hub_download, snapshot_download
repo, revision, dest, filename = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
if filename:
    hf_hub_download(repo_id=repo, revision=revision, filename=filename, local_dir=dest)
else:
    snapshot_download(repo_id=repo, revision=revision, local_dir=dest)
print("@@downloaded")
"""


def hf_download_command(image: str, repo: str, revision: str, staging_dir: str, filename: str | None = None) -> list[str]:
    """``docker run`` of the service's own image (its huggingface_hub) that downloads ``repo`` at
    ``revision`` into ``staging_dir`` on the host (as argv; quoted by the SSH layer)."""
    return ["docker", "run", "--rm", "--pull", "missing", "--user", "0:0",
            "-e", "HF_HUB_DISABLE_TELEMETRY=1", "-e", "HF_HUB_ENABLE_HF_TRANSFER=0",
            "-v", f"{staging_dir}:/llmfleet-download", "--entrypoint", "python3", image,
            "-c", HF_DOWNLOAD, repo, revision, "/llmfleet-download", filename or ""]


def hf_download_script(image: str, repo: str, revision: str, model_path: str, kind: str,
                       filename: str | None = None) -> str:
    """The download into a fresh staging folder, then (a file model) the one file moved to the staging
    file's place: after it, ``verify_script`` / ``commit_script`` finish as for a pushed copy."""
    mp = model_path.rstrip("/") or "/"
    part = M.part_path(mp)
    dl = part if kind == "dir" else part + ".dl"
    lines = ["umask 022", f"rm -rf -- {q(part)} {q(dl)} || exit 1", f"mkdir -p -- {q(dl)} || exit 1",
             shlex.join(hf_download_command(image, repo, revision, dl, filename)) + " || exit 1",
             f"rm -rf -- {q(dl + '/.cache')}"]
    if kind == "file":
        lines += [f"mv -f -- {q(dl + '/' + (filename or ''))} {q(part)} || exit 1", f"rm -rf -- {q(dl)}"]
    return "\n".join(lines)
