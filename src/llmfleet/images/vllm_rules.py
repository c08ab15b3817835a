"""The rules a vLLM release states in its own code, read from the files of its wheel (pure: texts in,
facts out; ``release_draft`` hands in the files, tests hand in recorded excerpts).

- ``QuantizationMethods`` (``vllm/model_executor/layers/quantization/__init__.py``): the
  ``--quantization`` values the release accepts. A method missing there is refused by the release
  (GGUF left in 0.24.0, bitsandbytes in 0.28.0: RFC vllm#39583).
- Each v1 attention backend's lower compute-capability bound (``supports_compute_capability`` of the
  class whose ``get_name()`` returns the backend's name, ``vllm/v1/attention/backends/*.py``):
  ``capability >= DeviceCapability(M, m)`` gives ``M.m``; ``return True`` gives ``any``; anything
  else is not read (None), never guessed.

- The architectures its model registry serves (``vllm/model_executor/models/registry.py``): the keys of
  ``_TEXT_GENERATION_MODELS`` and ``_MULTIMODAL_MODELS``, the names a checkpoint's config.json
  ``architectures`` is looked up by. A name missing there is refused at load ("Model architectures
  [...] are not supported for now").

``excerpt`` writes what was read as a small text a test can keep (the fixture of a release): the
``QuantizationMethods`` block and, per backend file, its ``get_name`` and ``supports_compute_capability``
lines, verbatim; the registry keys one a line. ``parse_excerpt`` reads that text back with the same
parsers.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
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
    for path in sorted(files):
        if path.startswith(BACKENDS_DIR) and path.endswith(".py") and "/" not in path[len(BACKENDS_DIR):]:
            name, floor = backend_floor(files[path])
            if name is not None and (name not in floors or floors[name] is None):
                floors[name] = floor
    caps: dict[str, str] = {}
    for path in sorted(files):
        if _in(path, QUANT_DIR) and path != QUANT_INIT:
            for k, v in quant_min_capabilities(files[path]).items():
                caps.setdefault(k, v)
    return VllmRules(quantization_methods(files.get(QUANT_INIT, "")), floors, caps,
                     registry_architectures(files.get(REGISTRY, "")))


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
        if name is None or body is None:
            continue
        out += [f"{FILE_MARK}{path}", f"    def get_name() -> str:\n        return \"{name.group(1)}\"",
                body.group(0).rstrip("\n")]
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
