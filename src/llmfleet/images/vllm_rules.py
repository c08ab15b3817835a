"""The rules a vLLM release states in its own code, read from the files of its wheel (pure: texts in,
facts out; ``release_draft`` hands in the files, tests hand in recorded excerpts).

- ``QuantizationMethods`` (``vllm/model_executor/layers/quantization/__init__.py``): the
  ``--quantization`` values the release accepts. A method missing there is refused by the release
  (GGUF left in 0.24.0, bitsandbytes in 0.28.0: RFC vllm#39583).
- Each v1 attention backend's lower compute-capability bound (``supports_compute_capability`` of the
  class whose ``get_name()`` returns the backend's name, ``vllm/v1/attention/backends/*.py``):
  ``capability >= DeviceCapability(M, m)`` gives ``M.m``; ``return True`` gives ``any``; anything
  else is not read (None), never guessed.

- Each v1 attention backend's KV-cache dtypes and the compute capabilities its fp8 KV cache runs on:
  the ``supported_kv_cache_dtypes`` list of the class, its own ``supports_kv_cache_dtype`` (a branch on
  ``"fp8..."`` / ``is_quantized_kv_cache`` and the helper it calls, e.g. fa_utils'
  ``flash_attn_supports_fp8``), and an ``if`` of the module that raises for fp8 below a capability
  (Triton's SM89 check from vllm PR #43914). Capability tests are read from known patterns:
  ``is_device_capability_family(90)`` and ``get_device_capability().major == 9`` give ``9.0-9.9``,
  ``has_device_capability(89)`` gives ``8.9+``, ``is_device_capability(100)`` gives ``10.0``; several
  are joined with ``,`` (either runs). fp8 accepted with no such test gives ``any``; an fp8 branch whose
  test is not one of these is None (not read), never guessed.

- The architectures its model registry serves (``vllm/model_executor/models/registry.py``): the keys of
  ``_TEXT_GENERATION_MODELS`` and ``_MULTIMODAL_MODELS``, the names a checkpoint's config.json
  ``architectures`` is looked up by. A name missing there is refused at load ("Model architectures
  [...] are not supported for now").

``excerpt`` writes what was read as a small text a test can keep (the fixture of a release): the
``QuantizationMethods`` block and, per backend file, its ``supported_kv_cache_dtypes`` list, fp8
``if ... raise`` guards, ``supports_kv_cache_dtype``, ``get_name`` and ``supports_compute_capability``
lines, verbatim; the fa_utils helpers (``flash_attn_supports_fp8``...); the registry keys one a line. ``parse_excerpt`` reads that text back with the same
parsers.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

QUANT_DIR = "vllm/model_executor/layers/quantization/"
QUANT_INIT = QUANT_DIR + "__init__.py"
BACKENDS_DIR = "vllm/v1/attention/backends/"
_LITERAL = re.compile(r"^QuantizationMethods\s*=\s*Literal\[(.*?)^\]", re.S | re.M)
_NAME = re.compile(r"def get_name\([^)]*\)[^:]*:\s*\n\s*return \"([A-Z0-9_]+)\"")
_SUPPORTS = re.compile(r"^(\s*)def supports_compute_capability\(.*?(?=^\1(?:@|def )|^\S|\Z)", re.S | re.M)
_CLASS = re.compile(r"^class (\w+)\b.*?(?=^class |^\S.*\n(?=^class )|\Z)", re.S | re.M)
_QNAME = re.compile(r"def get_name\([^)]*\)[^:]*:\s*\n\s*return \"([a-z0-9_-]+)\"")
_MINCAP = re.compile(r"def get_min_capability\([^)]*\)[^:]*:\s*\n(?:\s*#[^\n]*\n)*\s*return (\d+)\b")
_FLOOR = re.compile(r"capability\s*>=\s*DeviceCapability\(\s*(\d+)\s*,\s*(\d+)\s*\)")
_KV_LIST = re.compile(r"^([ \t]*)supported_kv_cache_dtypes\s*:[^=\n]*=\s*\[.*?\]\s*$", re.S | re.M)
_KV_METHOD = re.compile(r"^([ \t]*)def supports_kv_cache_dtype\(.*?(?=^\1(?:@|def )|^\S|\Z)", re.S | re.M)
# a top-level helper the backends call for their fp8 KV answer
_HELPER = re.compile(r"^def (flash_attn_supports_(?:fp8|kv_cache_dtype))\(.*?(?=^[A-Za-z_@#]|\Z)", re.S | re.M)
HELPERS = ("vllm/attention/utils/fa_utils.py", BACKENDS_DIR + "fa_utils.py")  # where they live (<= 0.10 / later)
FP8 = ("fp8", "fp8_e4m3", "fp8_e5m2")
ALIASES = {"fp8": "fp8_e4m3", "fp8_e4m3": "fp8"}  # vLLM's "fp8" is E4M3
# capability tests -> the compute capabilities they admit
_CAP_TESTS: tuple[tuple[re.Pattern[str], object], ...] = (
    (re.compile(r"is_device_capability_family\(\s*(\d+)\s*\)"), lambda n: f"{n // 10}.0-{n // 10}.9"),
    (re.compile(r"get_device_capability\(\)\.major\s*==\s*(\d+)\b"), lambda n: f"{n}.0-{n}.9"),
    (re.compile(r"has_device_capability\(\s*(\d+)\s*\)"), lambda n: f"{n // 10}.{n % 10}+"),
    (re.compile(r"is_device_capability\(\s*(\d+)\s*\)"), lambda n: f"{n // 10}.{n % 10}"),
)
FILE_MARK = "## file "
REGISTRY = "vllm/model_executor/models/registry.py"
REGISTRY_DICTS = ("_TEXT_GENERATION_MODELS", "_MULTIMODAL_MODELS")
KEYS_MARK = "## keys "  # one registry key a line: "## keys <file> <dict>"
_KEY = re.compile(r'^    "([^"]+)"\s*:', re.M)


@dataclass(frozen=True)
class VllmRules:
    methods: tuple[str, ...] = ()  # QuantizationMethods, in the release's order
    floors: dict[str, str | None] = field(default_factory=dict)  # backend -> "M.m" | "any" | None (not read)
    min_capability: dict[str, str] = field(default_factory=dict)  # method -> "M.m" (its config's get_min_capability)
    architectures: tuple[str, ...] = ()  # the model registry's text-generation and multimodal keys, sorted
    # backend -> the KV-cache dtypes it accepts (None: it names no list, every dtype)
    kv_dtypes: dict[str, tuple[str, ...] | None] = field(default_factory=dict)
    # backend -> compute capabilities its fp8 KV cache runs on: "9.0-9.9", "8.9+", "any", "a,b" (either);
    # None: an fp8 test not read. Only for backends that accept an fp8 dtype.
    kv_fp8_cc: dict[str, str | None] = field(default_factory=dict)


def registry_keys(text: str, name: str) -> tuple[str, ...]:
    """The keys of the module-level dict ``name = {...}`` of registry.py, in the file's order; () when
    the file has no such dict."""
    m = re.search(rf"^{name}\s*=\s*\{{\n(.*?)^\}}", text, re.S | re.M)
    return tuple(_KEY.findall(m.group(1))) if m else ()


def registry_architectures(text: str) -> tuple[str, ...]:
    """The architectures registry.py serves for generation: its text-generation and multimodal keys."""
    return tuple(sorted({k for d in REGISTRY_DICTS for k in registry_keys(text, d)}))


def quantization_methods(text: str) -> tuple[str, ...]:
    """The strings of the ``QuantizationMethods`` Literal (comments dropped); () when there is none."""
    m = _LITERAL.search(text)
    if m is None:
        return ()
    body = "\n".join(line.split("#", 1)[0] for line in m.group(1).splitlines())
    return tuple(re.findall(r"\"([^\"]+)\"", body))


def backend_floor(text: str) -> tuple[str | None, str | None]:
    """(the backend's name, its lower compute-capability bound) from one backend module's text; the
    name is None for a module that names no backend or states no bound (it inherits the base class's)."""
    name = _NAME.search(text)
    body = _SUPPORTS.search(text)
    if name is None or body is None:
        return None, None
    floor: str | None = None
    found = _FLOOR.search(body.group(0))
    if found is not None:
        floor = f"{found.group(1)}.{found.group(2)}"
    else:  # a body that is only ``return True``: every card
        after_def = body.group(0).split("\n", 1)[1] if "\n" in body.group(0) else ""
        statements = [ln.strip() for ln in after_def.splitlines() if ln.strip() and not ln.strip().startswith("#")]
        if statements == ["return True"]:
            floor = "any"
    return name.group(1), floor


def cap_specs(text: str) -> list[str]:
    """The compute-capability specs of the known capability tests in ``text``, in order, once each."""
    found: list[tuple[int, str]] = []
    for pattern, spec in _CAP_TESTS:
        for m in pattern.finditer(text):
            found.append((m.start(), spec(int(m.group(1)))))  # type: ignore[operator]
    out: list[str] = []
    for _, sp in sorted(found):
        if sp not in out:
            out.append(sp)
    return out


def helpers(files: Mapping[str, str]) -> dict[str, str]:
    """name -> text of the fa_utils helpers (``flash_attn_supports_fp8``...) the backends call."""
    out: dict[str, str] = {}
    for path in HELPERS:
        for m in _HELPER.finditer(files.get(path, "")):
            out.setdefault(m.group(1), m.group(0))
    return out


def _strings(text: str) -> list[str]:
    return re.findall(r"\"([^\"]+)\"", text)


def _branches(body: str) -> Iterator[tuple[str, str]]:
    """(condition, block) of each ``if`` of a text, in order (an ``if`` inside a block comes again)."""
    lines = body.splitlines()
    i = 0
    while i < len(lines):
        m = re.match(r"^(\s*)if (.*)$", lines[i])
        if m is None:
            i += 1
            continue
        ind, cond = len(m.group(1)), [m.group(2)]
        while not cond[-1].rstrip().endswith(":") and i + 1 < len(lines):
            i += 1
            cond.append(lines[i].strip())
        block: list[str] = []
        while i + 1 < len(lines) and (not lines[i + 1].strip() or len(lines[i + 1]) - len(lines[i + 1].lstrip()) > ind):
            i += 1
            block.append(lines[i])
        yield " ".join(cond), "\n".join(block)
        i += 1


def _is_fp8(cond: str) -> bool:
    return "fp8" in cond or "is_quantized_kv_cache(" in cond


def fp8_raises(text: str) -> list[tuple[str, str]]:
    """(condition, its lines verbatim) of each ``if`` of a module whose condition names fp8 and a
    known capability test and whose block raises: the refusal of fp8 KV below a capability."""
    out: list[tuple[str, str]] = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if not re.match(r"^\s*if ", line):
            continue
        for cond, block in _branches("\n".join(lines[i:])):
            if _is_fp8(cond) and cap_specs(cond) and re.search(r"^\s*raise\b", block, re.M):
                n = len(block.splitlines())
                j = i
                while not lines[j].rstrip().endswith(":"):
                    j += 1
                out.append((cond, "\n".join(lines[i:j + 1 + n]).rstrip("\n")))
            break
    return out


def backend_kv(text: str, helper_texts: Mapping[str, str]) -> tuple[tuple[str, ...] | None, str | None]:
    """(the KV dtypes one backend module accepts, the compute capabilities of its fp8 KV cache).

    The dtypes: the class's ``supported_kv_cache_dtypes`` (the base class's ``supports_kv_cache_dtype``
    checks membership), widened by the dtypes its own ``supports_kv_cache_dtype`` names (``in (...)``,
    ``== "..."``; ``startswith("fp8")`` or ``is_quantized_kv_cache`` admit every fp8 dtype) unless it
    first refuses what the list lacks. The fp8 capabilities: the tests of its fp8 branch (and of the
    helper that branch calls) and of the module's fp8 ``if ... raise``; "any" when fp8 is accepted with
    none; None when an fp8 branch tests something else."""
    listed_m = _KV_LIST.search(text)
    listed = tuple(_strings(listed_m.group(0).split("=", 1)[1])) if listed_m else None
    method = _KV_METHOD.search(text)
    body = method.group(0) if method else ""
    accepted: set[str] | None = set(listed) if listed is not None else None
    fp8_branches = [(c, b) for c, b in _branches(body) if _is_fp8(c)]
    if method is not None and "not in cls.supported_kv_cache_dtypes" not in body:
        named: set[str] = set()
        for cond, _block in _branches(body):
            named |= set(_strings(cond)) if re.search(r"kv_cache_dtype\s*(?:in|==)", cond) else set()
            if "startswith(\"fp8" in cond or "is_quantized_kv_cache(" in cond:
                named |= set(FP8)
        for m in re.finditer(r"kv_cache_dtype\s+in\s+[\(\[](.*?)[\)\]]", body, re.S):
            named |= set(_strings(m.group(1)))
        accepted = (accepted or set()) | named if ("super()" in body or accepted is not None) else named
    kv = tuple(sorted(accepted)) if accepted is not None else None
    if kv is not None and not set(kv) & set(FP8):
        return kv, None
    guard_text = ""
    for cond, block in fp8_branches:
        guard_text += cond + "\n" + block + "\n"
        for name, helper in helper_texts.items():
            if name + "(" in block or name + "(" in cond:
                guard_text += helper
    specs = cap_specs(guard_text) + [s for cond, _ in fp8_raises(text) for s in cap_specs(cond)]
    if specs:
        return kv, ",".join(dict.fromkeys(specs))
    if fp8_branches:
        return kv, None  # an fp8 test this reader does not know: not read
    return kv, "any"


def _in(path: str, folder: str) -> bool:
    return path.startswith(folder) and path.endswith(".py") and "/" not in path[len(folder):]


def quant_min_capabilities(text: str) -> dict[str, str]:
    """method -> "M.m" for each config class of one quantization module that names its method
    (``get_name``) and returns a constant from ``get_min_capability`` (75 -> "7.5")."""
    out: dict[str, str] = {}
    for m in _CLASS.finditer(text):
        name, cap = _QNAME.search(m.group(0)), _MINCAP.search(m.group(0))
        if name is not None and cap is not None:
            n = int(cap.group(1))
            out.setdefault(name.group(1), f"{n // 10}.{n % 10}")
    return out


def read_rules(files: Mapping[str, str]) -> VllmRules:
    """The rules from a wheel's files (path inside the wheel -> text)."""
    floors: dict[str, str | None] = {}
    kv_dtypes: dict[str, tuple[str, ...] | None] = {}
    kv_cc: dict[str, str | None] = {}
    helper_texts = helpers(files)
    for path in sorted(files):
        if path.startswith(BACKENDS_DIR) and path.endswith(".py") and "/" not in path[len(BACKENDS_DIR):]:
            name, floor = backend_floor(files[path])
            if name is not None and (name not in floors or floors[name] is None):
                floors[name] = floor
            named = _NAME.search(files[path])
            text = files[path]
            if named is not None and named.group(1) not in kv_dtypes and (_KV_LIST.search(text) or _KV_METHOD.search(text)):
                kv, fp8_cc = backend_kv(text, helper_texts)
                kv_dtypes[named.group(1)] = kv
                if kv is None or set(kv) & set(FP8):
                    kv_cc[named.group(1)] = fp8_cc
    caps: dict[str, str] = {}
    for path in sorted(files):
        if _in(path, QUANT_DIR) and path != QUANT_INIT:
            for k, v in quant_min_capabilities(files[path]).items():
                caps.setdefault(k, v)
    return VllmRules(quantization_methods(files.get(QUANT_INIT, "")), floors, caps,
                     registry_architectures(files.get(REGISTRY, "")), kv_dtypes, kv_cc)


def excerpt(files: Mapping[str, str], version: str, wheel: str) -> str:
    """What ``read_rules`` reads, verbatim, as a fixture: a header naming the wheel and the tag, then
    one block per file."""
    out = [f"# vllm {version}: excerpts of {wheel} (https://github.com/vllm-project/vllm/tree/v{version})",
           "# read by llmfleet.images.vllm_rules; each block is the file's own lines"]
    m = _LITERAL.search(files.get(QUANT_INIT, ""))
    if m is not None:
        out += [f"{FILE_MARK}{QUANT_INIT}", m.group(0)]
    for path in sorted(files):
        if not (path.startswith(BACKENDS_DIR) and path.endswith(".py") and "/" not in path[len(BACKENDS_DIR):]):
            continue
        text = files[path]
        name, body = _NAME.search(text), _SUPPORTS.search(text)
        if name is None or (body is None and not (_KV_LIST.search(text) or _KV_METHOD.search(text))):
            continue
        kv = [m.group(0).rstrip("\n") for m in (_KV_LIST.search(text),) if m is not None]
        kv += [lines for _, lines in fp8_raises(text)]
        kv += [m.group(0).rstrip("\n") for m in (_KV_METHOD.search(text),) if m is not None]
        out += [f"{FILE_MARK}{path}", *kv, f"    def get_name() -> str:\n        return \"{name.group(1)}\"",
                *([body.group(0).rstrip("\n")] if body is not None else [])]
    for path in HELPERS:
        found = [m.group(0).rstrip("\n") for m in _HELPER.finditer(files.get(path, ""))]
        if found:
            out += [f"{FILE_MARK}{path}", *found]
    for path in sorted(files):
        if not _in(path, QUANT_DIR) or path == QUANT_INIT:
            continue
        blocks = []
        for m in _CLASS.finditer(files[path]):
            qn, cap = _QNAME.search(m.group(0)), _MINCAP.search(m.group(0))
            if qn is not None and cap is not None:
                blocks += [m.group(0).splitlines()[0], f"    def get_name(cls) -> str:\n        return \"{qn.group(1)}\"",
                           f"    def get_min_capability(cls) -> int:\n        return {cap.group(1)}"]
        if blocks:
            out += [f"{FILE_MARK}{path}", *blocks]
    for dict_name in REGISTRY_DICTS:
        keys = registry_keys(files.get(REGISTRY, ""), dict_name)
        if keys:
            out += [f"{KEYS_MARK}{REGISTRY} {dict_name}", *keys]
    return "\n".join(out) + "\n"


def parse_excerpt(text: str) -> VllmRules:
    """``excerpt``'s text read back into the files it quotes, then ``read_rules``; a keys block is
    written back as the dict it lists."""
    files: dict[str, list[str]] = {}
    keys: dict[str, dict[str, list[str]]] = {}  # file -> dict name -> its keys
    current: list[str] | None = None
    for line in text.splitlines():
        if line.startswith(FILE_MARK):
            current = files.setdefault(line[len(FILE_MARK):].strip(), [])
        elif line.startswith(KEYS_MARK):
            path, _, name = line[len(KEYS_MARK):].strip().rpartition(" ")
            current = keys.setdefault(path, {}).setdefault(name, [])
        elif current is not None and line.strip():
            current.append(line)
    for path, dicts in keys.items():
        for name, names in dicts.items():
            files.setdefault(path, []).extend([f"{name} = {{", *(f'    "{k.strip()}": (),' for k in names), "}"])
    return read_rules({p: "\n".join(lines) + "\n" for p, lines in files.items()})
