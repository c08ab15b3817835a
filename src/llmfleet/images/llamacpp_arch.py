"""The model architectures a llama.cpp build knows, read from its own ``src/llama-arch.cpp`` (pure:
text in, names out).

A GGUF file names its architecture in ``general.architecture``; llama.cpp looks that name up in the
``LLM_ARCH_NAMES`` map of ``src/llama-arch.cpp`` and refuses a name the map lacks ("unknown model
architecture: 'qwen3moe'"). ``arch_names`` reads the map's names (``(unknown)``, the placeholder of
LLM_ARCH_UNKNOWN, left out); ``excerpt`` keeps the map verbatim under a header naming the build and
the file's address, as a fixture a test can keep; ``parse_excerpt`` reads that text back.
"""

from __future__ import annotations

import re

_MAP = re.compile(r"^static const std::map<llm_arch, const char \*> LLM_ARCH_NAMES = \{\n.*?^\};", re.S | re.M)
_ENTRY = re.compile(r'\{\s*LLM_ARCH_\w+\s*,\s*"([^"]+)"\s*\}')


def arch_names(text: str) -> tuple[str, ...]:
    """The names of the ``LLM_ARCH_NAMES`` map, sorted; () when the text has no such map."""
    m = _MAP.search(text)
    if m is None:
        return ()
    return tuple(sorted({n for n in _ENTRY.findall(m.group(0)) if n != "(unknown)"}))


def excerpt(text: str, build: str, url: str, note: str = "") -> str:
    """The ``LLM_ARCH_NAMES`` map of ``text`` verbatim, under a header naming the build and the file's
    address (``url``); ``note`` says where it was read when that is not the tag itself."""
    m = _MAP.search(text)
    if m is None:
        raise ValueError(f"llama.cpp {build}: no LLM_ARCH_NAMES map in the text; give src/llama-arch.cpp of that build")
    head = [f"# llama.cpp {build}: src/llama-arch.cpp ({url})",
            "# read by llmfleet.images.llamacpp_arch; the LLM_ARCH_NAMES map, verbatim"]
    return "\n".join(head + ([f"# {note}"] if note else []) + [m.group(0)]) + "\n"


def parse_excerpt(text: str) -> tuple[str, ...]:
    """``excerpt``'s text read back: the build's architecture names."""
    return arch_names(text)
