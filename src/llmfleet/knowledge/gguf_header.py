"""A GGUF file's header and tensor table, read with the standard library only (no gguf, no numpy).

What ``modelinfo.read_gguf`` needs: the metadata key/values and, per tensor, its name, shape, ggml type
and byte size. The tensor data is never read. The format: https://github.com/ggml-org/ggml/blob/master/docs/gguf.md
(little-endian files, versions 2 and 3). The reader offers the attributes of gguf-py's ``GGUFReader``
that llmfleet uses (``fields[key].contents()``, ``tensors[i].name/shape/tensor_type/n_elements/n_bytes``).
"""

from __future__ import annotations

import math
import mmap
import struct
from dataclasses import dataclass
from typing import Any

MAGIC = b"GGUF"
# ggml type id -> (name, elements per block, bytes per block); ggml.h and gguf-py's GGML_QUANT_SIZES
GGML_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20), 6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 40), 10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110),
    12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292),
    16: ("IQ2_XXS", 256, 66), 17: ("IQ2_XS", 256, 74), 18: ("IQ3_XXS", 256, 98), 19: ("IQ1_S", 256, 50),
    20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110), 22: ("IQ2_S", 256, 82), 23: ("IQ4_XS", 256, 136),
    24: ("I8", 1, 1), 25: ("I16", 1, 2), 26: ("I32", 1, 4), 27: ("I64", 1, 8), 28: ("F64", 1, 8),
    29: ("IQ1_M", 256, 56), 30: ("BF16", 1, 2), 34: ("TQ1_0", 256, 54), 35: ("TQ2_0", 256, 66),
    39: ("MXFP4", 32, 17), 40: ("NVFP4", 64, 36), 41: ("Q1_0", 128, 18),
}  # fmt: skip
# metadata value type -> struct format (8: string, 9: array are read apart)
_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
# String arrays longer than this (a tokenizer's vocabulary) are counted, not decoded.
DECODE_STRINGS_UP_TO = 4096


class GGUFError(ValueError):
    """Not a GGUF file this reader can read (the message says why)."""


@dataclass(frozen=True)
class Field:
    value: Any

    def contents(self) -> Any:
        return self.value


@dataclass(frozen=True)
class TensorType:
    id: int
    name: str


@dataclass(frozen=True)
class Tensor:
    name: str
    shape: tuple[int, ...]  # GGUF order: the fastest-varying dimension first
    tensor_type: TensorType
    n_elements: int
    n_bytes: int


class GGUFHeader:
    """``GGUFHeader(path)``: the file's metadata (``fields``) and tensor table (``tensors``)."""

    def __init__(self, path: str, mode: str = "r") -> None:
        with open(path, "rb") as fh:
            size = fh.seek(0, 2)
            if size < 24:
                raise GGUFError("too short for a GGUF header")
            with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
                self.fields, self.tensors = _parse(buf)


def _parse(buf: Any) -> tuple[dict[str, Field], list[Tensor]]:
    if bytes(buf[:4]) != MAGIC:
        raise GGUFError("no GGUF magic at the start of the file")
    (version,) = struct.unpack_from("<I", buf, 4)
    if version not in (2, 3):
        raise GGUFError(f"GGUF version {version} (big-endian or unknown); this reader takes versions 2 and 3")
    n_tensors, n_kv = struct.unpack_from("<QQ", buf, 8)
    pos = 24
    fields: dict[str, Field] = {}
    for _ in range(n_kv):
        key, pos = _string(buf, pos)
        (vtype,), pos = struct.unpack_from("<I", buf, pos), pos + 4
        value, pos = _value(buf, pos, vtype)
        fields[key] = Field(value)
    tensors: list[Tensor] = []
    for _ in range(n_tensors):
        name, pos = _string(buf, pos)
        (n_dims,), pos = struct.unpack_from("<I", buf, pos), pos + 4
        if n_dims > 8:
            raise GGUFError(f"tensor {name}: {n_dims} dimensions")
        dims = struct.unpack_from(f"<{n_dims}Q", buf, pos)
        pos += 8 * n_dims
        ttype, _offset = struct.unpack_from("<IQ", buf, pos)
        pos += 12
        if ttype not in GGML_TYPES:
            raise GGUFError(f"tensor {name}: unknown ggml type {ttype}")
        tname, block, block_bytes = GGML_TYPES[ttype]
        n = math.prod(dims)
        tensors.append(Tensor(name, tuple(int(d) for d in dims), TensorType(ttype, tname), n, n // block * block_bytes))
    return fields, tensors


def _string(buf: Any, pos: int) -> tuple[str, int]:
    (n,) = struct.unpack_from("<Q", buf, pos)
    pos += 8
    if pos + n > len(buf):
        raise GGUFError("a string runs past the end of the file")
    return bytes(buf[pos:pos + n]).decode("utf-8", errors="replace"), pos + n


def _value(buf: Any, pos: int, vtype: int) -> tuple[Any, int]:
    if vtype in _SCALAR:
        fmt = _SCALAR[vtype]
        return struct.unpack_from(fmt, buf, pos)[0], pos + struct.calcsize(fmt)
    if vtype == 8:
        return _string(buf, pos)
    if vtype == 9:
        (item_type, count), pos = struct.unpack_from("<IQ", buf, pos), pos + 12
        if item_type in _SCALAR:
            fmt = _SCALAR[item_type]
            width = struct.calcsize(fmt)
            if pos + width * count > len(buf):
                raise GGUFError("an array runs past the end of the file")
            return list(struct.unpack_from(f"<{count}{fmt[1]}", buf, pos)), pos + width * count
        if item_type == 8 and count > DECODE_STRINGS_UP_TO:
            for _ in range(count):  # counted, not decoded
                (n,) = struct.unpack_from("<Q", buf, pos)
                pos += 8 + n
            return [None] * count, pos
        out = []
        for _ in range(count):
            item, pos = _value(buf, pos, item_type)
            out.append(item)
        return out, pos
    raise GGUFError(f"unknown metadata value type {vtype}")
