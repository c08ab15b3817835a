"""What a llama.cpp build's own source says about its CUDA flash attention and its GGUF tensor types
(pure: text in, rules out).

Flash attention (``ggml/src/ggml-cuda/fattn.cu``): the vector kernels are instantiated per head size
and K/V cache type pair, in a block that differs with ``GGML_CUDA_FA_ALL_QUANTS`` (``#ifdef`` /
``#else``). ``fa_table`` reads those pairs: the types whose K and V pair has a kernel without the flag
(``types``), K/V pairs of two types without it (``mixed``), the types any pair of which has one with it
(``all_quants_types``), and the head sizes where a quantized cache has a kernel (``quant_head_sizes``;
None where the build converts a quantized cache for its other kernels, so the vector kernels do not
bound it). The backend's ``supports_op`` (``ggml-cuda.cu``) says which caches ggml-cuda refuses, so
that the attention runs on the CPU: ``cpu_types``.

GGUF tensor types (``ggml/include/ggml.h``, ``enum ggml_type``): ``ggml_types`` reads the names a
build knows (``MXFP4``, ...); a GGUF holding a tensor of another type does not load.

``*_excerpt`` keep the parts read, verbatim, under a header naming the build and the files' addresses,
as fixtures a test can keep; ``parse_*`` read them back.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# ------------------------------------------------------------------------------- ggml_type names

_ENUM = re.compile(r"^ *enum ggml_type \{\n.*?^ *\};", re.S | re.M)
_TYPE = re.compile(r"^\s*GGML_TYPE_(\w+)\s*=\s*\d+\s*,", re.M)  # a commented-out (removed) type starts with //


def ggml_types(text: str) -> tuple[str, ...]:
    """The ``enum ggml_type`` names of ``ggml.h`` (without ``GGML_TYPE_`` and ``COUNT``), sorted; ()
    when the text has no such enum."""
    m = _ENUM.search(text)
    if m is None:
        return ()
    return tuple(sorted({n for n in _TYPE.findall(m.group(0)) if n != "COUNT"}))


def types_excerpt(text: str, build: str, url: str, note: str = "") -> str:
    """The ``enum ggml_type`` of ``text`` verbatim, under a header naming the build and ``url``."""
    m = _ENUM.search(text)
    if m is None:
        raise ValueError(f"llama.cpp {build}: no enum ggml_type in the text; give ggml/include/ggml.h of that build")
    head = [f"# llama.cpp {build}: ggml/include/ggml.h ({url})",
            "# read by llmfleet.images.llamacpp_rules; the enum ggml_type, verbatim"]
    return "\n".join(head + ([f"# {note}"] if note else []) + [m.group(0)]) + "\n"


def parse_types_excerpt(text: str) -> tuple[str, ...]:
    """``types_excerpt``'s text read back: the build's GGUF tensor type names."""
    return ggml_types(text)


# ------------------------------------------------------------------------------- flash attention

_CT = {"F32": "f32", "F16": "f16", "BF16": "bf16", "Q4_0": "q4_0", "Q4_1": "q4_1", "Q5_0": "q5_0",
       "Q5_1": "q5_1", "Q8_0": "q8_0", "IQ4_NL": "iq4_nl"}
_QUANT = {"q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "iq4_nl"}
# old layout (b5000): FATTN_VEC_F16_CASE(D, K, V) / FATTN_VEC_F32_CASE; new: FATTN_VEC_CASE(D, K, V) and
# FATTN_VEC_CASES_ALL_D(K, V) (every D of the macro)
_CASE = re.compile(r"^\s*FATTN_VEC_(?:F16_|F32_)?CASE\(\s*(\d+)\s*,\s*GGML_TYPE_(\w+)\s*,\s*GGML_TYPE_(\w+)\s*\)", re.M)
_ALL_D = re.compile(r"^\s*FATTN_VEC_CASES_ALL_D\(\s*(?:GGML_TYPE_)?(\w+)\s*,\s*(?:GGML_TYPE_)?(\w+)\s*\)", re.M)
_ALL_D_DEF = re.compile(r"#define FATTN_VEC_CASES_ALL_D\(type_K(?:_case)?, type_V(?:_case)?\)(.*?)\n\s*\n", re.S)
# the vector kernels' dispatch functions: their case lists, with the #ifdef / #else blocks
_VEC_FN = re.compile(r"^(?:static )?(?:void ggml_cuda_flash_attn_ext_vec(?:_f16|_f32)?\(ggml_backend_cuda_context & ctx, "
                     r"ggml_tensor \* dst\)|fattn_vec_case_t ggml_cuda_get_fattn_vec_case\([^)]*\)) \{\n.*?^\}", re.S | re.M)
_VEC_CASE_DEF = re.compile(r"^#define FATTN_VEC_CASE\(D, type_K(?:_case)?, type_V(?:_case)?\).*?\n\s*\n", re.S | re.M)
_F32_AS_F16 = re.compile(r"(?:K->type|type_K) == GGML_TYPE_F32 && \(?(?:type_K|GGML_TYPE_##type_K_case)\)? == GGML_TYPE_F16")
_KV_SUPPORTED = re.compile(r"^static bool ggml_cuda_fattn_kv_type_supported\((?:const )?ggml_type type\) \{\n.*?^\}", re.S | re.M)
_SAME_TYPE = re.compile(r"^#ifndef GGML_CUDA_FA_ALL_QUANTS\n\s*if \(K->type != V->type\) \{\n.*?#endif[^\n]*", re.S | re.M)
_SUPPORTS_OP = re.compile(r"^( *)case GGML_OP_FLASH_ATTN_EXT: \{\n.*?^\1\}\n", re.S | re.M)


@dataclass(frozen=True)
class FaTable:
    """The CUDA flash-attention K/V rules of one build, as read."""

    types: tuple[str, ...]  # K and V of one of these: a kernel without GGML_CUDA_FA_ALL_QUANTS
    mixed: tuple[tuple[str, str], ...]  # K, V of two types with a kernel without the flag
    all_quants_types: tuple[str, ...]  # any K, V pair of these with GGML_CUDA_FA_ALL_QUANTS
    quant_head_sizes: tuple[int, ...] | None  # a quantized cache has kernels only at these head sizes
    cpu_types: tuple[str, ...]  # K or V of these: supports_op refuses flash attention (it runs on the CPU)
    any_pair: bool = False  # any K, V pair of ``types`` runs (those without a vector kernel converted to f16)


def _vec_pairs(text: str) -> tuple[set[tuple[int, str, str]], set[tuple[int, str, str]]]:
    """(pairs without GGML_CUDA_FA_ALL_QUANTS, pairs with it) of the vector dispatch functions."""
    all_d = [64, 128, 256]
    m = _ALL_D_DEF.search(text)
    if m is not None:
        all_d = [int(d) for d in re.findall(r"FATTN_VEC_CASE\(\s*(\d+)", m.group(1))]
    f32_as_f16 = _F32_AS_F16.search(text) is not None
    plain: set[tuple[int, str, str]] = set()
    quants: set[tuple[int, str, str]] = set()
    for fn in _VEC_FN.findall(text):
        mode = "both"
        for line in fn.splitlines():
            s = line.strip()
            if s.startswith("#ifdef GGML_CUDA_FA_ALL_QUANTS"):
                mode = "all"
            elif s.startswith("#else") and mode == "all":
                mode = "plain"
            elif s.startswith("#endif") and "GGML_CUDA_FA_ALL_QUANTS" in s:
                mode = "both"
            found = [(int(d), k, v) for d, k, v in _CASE.findall(line)]
            found += [(d, k, v) for k, v in _ALL_D.findall(line) for d in all_d]
            for d, k, v in found:
                if k not in _CT or v not in _CT:
                    continue
                ks, vs = [_CT[k]], [_CT[v]]
                if f32_as_f16:
                    ks += ["f32"] if k == "F16" else []
                    vs += ["f32"] if v == "F16" else []
                for kk in ks:
                    for vv in vs:
                        if mode in ("plain", "both"):
                            plain.add((d, kk, vv))
                        if mode in ("all", "both"):
                            quants.add((d, kk, vv))
    return plain, quants


def _kv_supported(text: str, all_quants: bool) -> set[str] | None:
    """The types ``ggml_cuda_fattn_kv_type_supported`` accepts (None: the build has no such function)."""
    m = _KV_SUPPORTED.search(text)
    if m is None:
        return None
    out: set[str] = set()
    pending: list[str] = []
    skip = False
    for line in m.group(0).splitlines():
        s = line.strip()
        if s.startswith("#ifndef GGML_CUDA_FA_ALL_QUANTS"):
            skip = all_quants
            continue
        if s.startswith("#endif"):
            skip = False
            continue
        if skip:
            continue
        c = re.match(r"case GGML_TYPE_(\w+):", s)
        if c:
            pending.append(c.group(1))
        elif s == "return true;":
            out |= {_CT[t] for t in pending if t in _CT}
            pending = []
        elif s == "return false;":
            pending = []
    return out


def fa_table(text: str) -> FaTable:
    """The CUDA flash-attention K/V rules of a build, from its ``fattn.cu`` and the flash-attention case
    of ``ggml-cuda.cu``'s supports_op (one text, or ``fattn_excerpt``'s)."""
    plain, quants = _vec_pairs(text)
    if not plain:
        raise ValueError("no FATTN_VEC case of the vector flash-attention kernels in the text")
    kv_plain = _kv_supported(text, all_quants=False)
    kv_all = _kv_supported(text, all_quants=True)
    same_only = _SAME_TYPE.search(text) is not None
    types = sorted({k for _, k, v in plain if k == v})
    mixed = sorted({(k, v) for _, k, v in plain if k != v})
    all_q = sorted({t for _, k, v in quants for t in (k, v)})
    heads: tuple[int, ...] | None
    if kv_plain is not None:
        # the kernel choice (ggml_cuda_get_best_fattn_kernel) admits a type by itself, whatever the head
        # size; pairs of two types only with the flag when the build says so
        types = sorted(t for t in types if t in kv_plain)
        all_q = sorted(set(all_q) | (kv_all or set()))
        mixed = []
        heads = None
        if not same_only:  # no K/V type rule: every supported type, in any pair
            types = sorted(kv_plain)
            return FaTable(tuple(types), (), tuple(sorted(kv_all or kv_plain)), None,
                           tuple(sorted(set(_CT.values()) - kv_plain)), any_pair=True)
    else:
        heads = tuple(sorted({d for d, k, v in plain if k == v and k in _QUANT}))
    cpu: list[str] = []
    sup = _SUPPORTS_OP.search(text)
    if sup is not None:
        for t, name in _CT.items():
            if f"op->src[1]->type == GGML_TYPE_{t} || op->src[2]->type == GGML_TYPE_{t}" in sup.group(0):
                cpu.append(name)
    elif kv_plain is not None and kv_all is not None:
        cpu = sorted(set(_CT.values()) - kv_all)
    return FaTable(tuple(types), tuple(mixed), tuple(all_q), heads, tuple(sorted(cpu)))


def outside(text: str) -> str:
    """What a K/V pair outside the table does at this build (catalog ``outside``), from ``fattn_excerpt``'s
    text: "abort" where supports_op accepts every non-BF16 pair at head size 128 and on_no_fattn_vec_case
    aborts when the vector kernel for the pair is missing (b5000's era), else "cpu" (supports_op refuses
    the pair: the attention runs on the CPU)."""
    aborts = ("static void on_no_fattn_vec_case" in text and "GGML_ABORT" in text
              and "if (op->src[0]->ne[0] == 128) {\n                return true;" in text)
    return "abort" if aborts else "cpu"


def fattn_excerpt(fattn: str, cuda: str, build: str, url_fattn: str, url_cuda: str, note: str = "") -> str:
    """The parts of ``fattn.cu`` (``fattn``) and ``ggml-cuda.cu`` (``cuda``) ``fa_table`` reads, verbatim,
    under a header naming the build and both files' addresses."""
    parts = [m.group(0) for m in (_ALL_D_DEF.search(fattn), _VEC_CASE_DEF.search(fattn)) if m is not None]
    parts += _VEC_FN.findall(fattn)
    if not parts:
        raise ValueError(f"llama.cpp {build}: no vector flash-attention dispatch in the text; give "
                         "ggml/src/ggml-cuda/fattn.cu of that build")
    parts += [m.group(0) for m in (_KV_SUPPORTED.search(fattn), _SAME_TYPE.search(fattn)) if m is not None]
    on_no = re.search(r"^static void on_no_fattn_vec_case\(const int D\) \{\n.*?^\}", fattn, re.S | re.M)
    sup = _SUPPORTS_OP.search(cuda)
    if sup is not None:
        parts.append(f"// ggml/src/ggml-cuda/ggml-cuda.cu ({url_cuda}), ggml_backend_cuda_device_supports_op:\n"
                     + sup.group(0).rstrip("\n"))
    if on_no is not None:
        parts.append(on_no.group(0))
    head = [f"# llama.cpp {build}: ggml/src/ggml-cuda/fattn.cu ({url_fattn})",
            "# read by llmfleet.images.llamacpp_rules; the vector flash-attention dispatch and the K/V type "
            "rules, verbatim"]
    return "\n".join(head + ([f"# {note}"] if note else [])) + "\n" + "\n\n".join(parts) + "\n"


def parse_fattn_excerpt(text: str) -> FaTable:
    """``fattn_excerpt``'s text read back."""
    return fa_table(text)
