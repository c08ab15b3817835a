"""Which GPU architectures a CUDA binary carries code for, read from its ELF ``.nv_fatbin`` section.

Pure and standard-library only (``images.inspect`` also runs this file inside an image with the
image's own Python). ``cuobjdump --list-elf/--list-ptx`` tells the same where it is installed
(``parse_cuobjdump``); runtime images do not have it.

Layout (the fatbin container NVIDIA's tools write; not a published ABI, read as several
independent open-source readers do): a 16-byte container header (magic ``0xBA55ED50``, u16
version, u16 header size, u64 size of the entries), then entries, each a header with u16 kind
(1 PTX, 2 ELF/SASS) at 0, u32 header size at 4, u64 payload size at 8 and u32 ``sm_version``
(e.g. 86) at 28, followed by the payload. Payloads may be compressed; the headers are not.
"""

from __future__ import annotations

import re
import struct

FATBIN_MAGIC = 0xBA55ED50
KIND_PTX = 1
KIND_ELF = 2
_SECTIONS = (b".nv_fatbin", b"__nv_relfatbin")
_MAX_ENTRIES = 100_000


class NotElf(ValueError):
    """The bytes are not a 64-bit little-endian ELF file."""


def _cc(sm: int) -> str:
    return f"{sm // 10}.{sm % 10}"


def elf_sections(data: bytes) -> dict[bytes, bytes]:
    """Section name -> contents of a 64-bit little-endian ELF file (sections without file data are
    left out)."""
    if len(data) < 64 or data[:4] != b"\x7fELF":
        raise NotElf("no ELF header")
    if data[4] != 2 or data[5] != 1:
        raise NotElf("not a 64-bit little-endian ELF file")
    shoff = struct.unpack_from("<Q", data, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    if shoff == 0 or shnum == 0 or shentsize < 64 or shoff + shnum * shentsize > len(data) or shstrndx >= shnum:
        raise NotElf("section header table out of range")

    def header(i: int) -> tuple[int, int, int, int]:
        name, kind, _flags, _addr, offset, size = struct.unpack_from("<IIQQQQ", data, shoff + i * shentsize)
        return name, kind, offset, size

    _, _, str_off, str_size = header(shstrndx)
    strtab = data[str_off:str_off + str_size]
    out: dict[bytes, bytes] = {}
    for i in range(shnum):
        name_off, kind, offset, size = header(i)
        if kind == 8 or offset + size > len(data):  # SHT_NOBITS, or truncated
            continue
        end = strtab.find(b"\0", name_off)
        name = strtab[name_off:end if end >= 0 else len(strtab)]
        out[name] = data[offset:offset + size]
    return out


def fatbin_containers(blob: bytes) -> list[list[tuple[int, int]]]:
    """(kind, sm_version) of the entries of each fatbin container in ``blob`` (one section may hold
    several containers back to back, 8-byte aligned; nvcc writes one per object file)."""
    out: list[list[tuple[int, int]]] = []
    total = 0
    pos = 0
    while pos + 16 <= len(blob) and total < _MAX_ENTRIES:
        magic, _version, hsize, fat_size = struct.unpack_from("<IHHQ", blob, pos)
        if magic != FATBIN_MAGIC:
            pos += 8  # padding between containers
            continue
        start = pos + hsize
        end = min(start + fat_size, len(blob))
        e = start
        entries: list[tuple[int, int]] = []
        while e + 32 <= end and total < _MAX_ENTRIES:
            kind, _ev, ehsize, payload = struct.unpack_from("<HHIQ", blob, e)
            sm = struct.unpack_from("<I", blob, e + 28)[0]
            if ehsize < 32 or kind not in (KIND_PTX, KIND_ELF):
                break
            entries.append((kind, sm))
            total += 1
            e += ehsize + payload
        out.append(entries)
        pos = max(end, pos + 16)
        pos += -pos % 8
    return out


def fatbin_entries(blob: bytes) -> list[tuple[int, int]]:
    """(kind, sm_version) of every entry of the fatbin containers in ``blob``."""
    return [entry for container in fatbin_containers(blob) for entry in container]


def arch_shares(data: bytes) -> tuple[int, dict[str, int], dict[str, int]]:
    """How widely each architecture is carried in an ELF file's fatbins: (number of non-empty
    containers, SASS arch -> containers carrying it, PTX arch -> containers carrying it). An arch of
    the build's list (TORCH_CUDA_ARCH_LIST, CMAKE_CUDA_ARCHITECTURES) is in (nearly) every container;
    one that only a few arch-specific kernels carry (sm_90a, sm_103a CUTLASS kernels) is in a few.
    Raises NotElf for a file that is not ELF."""
    sections = elf_sections(data)
    n = 0
    sass: dict[str, int] = {}
    ptx: dict[str, int] = {}
    for name in _SECTIONS:
        for container in fatbin_containers(sections.get(name, b"")):
            if not container:
                continue
            n += 1
            for kind, sm in set(container):
                target = sass if kind == KIND_ELF else ptx
                target[_cc(sm)] = target.get(_cc(sm), 0) + 1
    return n, sass, ptx


def fatbin_archs(data: bytes) -> tuple[list[str], list[str]]:
    """(SASS archs, PTX archs) as compute capabilities (``"8.6"``) of an ELF file's fatbins, sorted
    and unique. Raises NotElf for a file that is not ELF."""
    sections = elf_sections(data)
    sass: set[int] = set()
    ptx: set[int] = set()
    for name in _SECTIONS:
        for kind, sm in fatbin_entries(sections.get(name, b"")):
            (sass if kind == KIND_ELF else ptx).add(sm)
    return [_cc(s) for s in sorted(sass)], [_cc(p) for p in sorted(ptx)]


_CUOBJDUMP = re.compile(r"^(ELF|PTX) file\s+\d+:\s+\S*?\.sm_(\d+)([a-z]?)\.(?:cubin|ptx)\s*$")


def parse_cuobjdump(text: str) -> tuple[list[str], list[str]]:
    """(SASS, PTX) archs from ``cuobjdump --list-elf`` / ``--list-ptx`` output (lines like
    ``ELF file    1: libggml-cuda.1.sm_86.cubin``). Arch-specific ``sm_90a`` stays ``9.0a``."""
    sass: list[str] = []
    ptx: list[str] = []
    for line in text.splitlines():
        m = _CUOBJDUMP.match(line.strip())
        if not m:
            continue
        sm = int(m.group(2))
        cc = _cc(sm) + m.group(3)
        target = sass if m.group(1) == "ELF" else ptx
        if cc not in target:
            target.append(cc)
    key = lambda c: tuple(int(x) for x in c.rstrip("abcdef").split("."))  # noqa: E731
    return sorted(sass, key=key), sorted(ptx, key=key)


def lock_archs(sass: list[str], ptx: list[str]) -> list[str]:
    """The images.lock notation: ``"8.6"`` SASS only, ``"9.0+PTX"`` both, ``"5.0-virtual"`` PTX only."""
    out = [f"{a}+PTX" if a in ptx else a for a in sass]
    out += [f"{a}-virtual" for a in ptx if a not in sass]
    return out
