"""Reading YAML: libyaml's C parser when PyYAML was built with it, else PyYAML's own Python one.

Both build the same safe subset (``SafeLoader``'s constructors: no Python objects); the C parser reads
the catalogs about ten times faster (0.3 s of CPU on every deploy with the Python one), so every
llmfleet file (catalogs, inventories, images.lock, role defaults) is read through here.

llmfleet's own data files (the catalogs, images.lock, role defaults: no secrets in them) are read with
``keep=True``: what the parser built is kept in the private cache folder ``yaml`` (``llmfleet.cache``)
as ``marshal`` data, keyed by the text itself and the parser's and Python's versions, so an unchanged
file is read back in a tenth of a millisecond instead of parsed again (the five catalogs took ~35 ms
of every command). A value ``marshal`` cannot hold (a YAML timestamp) just leaves the file unkept.
Measured with this and the compiled templates (``release.template_cache``) both off (docs/bench.md
"Start-up tricks"): a no-change deploy's CPU 0.65 -> 0.75 s, a changed deploy 2.62 -> 2.83 s (medians
of three sittings). Kept.
"""

from __future__ import annotations

import hashlib
import sys
from typing import Any

import yaml

#: the safe loader to subclass or pass as ``Loader=`` (C-accelerated when available)
SafeLoader: type = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

CACHE = "yaml"
KEEP_MIN_CHARS = 2048  # smaller files parse faster than the cache is looked up


def safe_load(text: str, *, keep: bool = False) -> Any:
    """``yaml.safe_load`` through the fastest safe loader; ``keep``: through the cache (never for a
    text that may hold a secret, such as an inventory)."""
    if not keep or len(text) < KEEP_MIN_CHARS:
        return _parse(text)
    from llmfleet import cache

    return cache.kept(CACHE, cache_key(text), lambda: _parse(text))


def cache_key(text: str) -> str:
    """What a kept parse depends on: the text, PyYAML's version and loader, Python's version."""
    return hashlib.sha256(f"{yaml.__version__}\0{SafeLoader.__name__}\0{sys.version}\0{text}".encode()).hexdigest()


def _parse(text: str) -> Any:
    return yaml.load(text, Loader=SafeLoader)  # noqa: S506 - a SafeLoader (C or Python)
