"""Compiled templates kept across runs: Jinja compiles each template (a role's compose file, the unit,
the env file) to Python code, ~15 ms each, every command. The code is kept in the private cache folder
``templates`` (``llmfleet.cache``), keyed by the template's text and the Jinja and Python versions, as
Jinja's own bytecode cache does for file templates. Rendering stays a function of its inputs: what is
kept is exactly what compiling the text gives. Measured with this and the kept YAML parses
(``llmfleet.yamlload``) both off: docs/bench.md "Start-up tricks" (a changed deploy 2.62 -> 2.83 s).
"""

from __future__ import annotations

import hashlib
import sys
from typing import Any

import jinja2

from llmfleet import cache

CACHE = "templates"
VERSION = 1  # raise when render._env()'s options change: they shape the compiled code


def code_for(env: jinja2.Environment, text: str) -> Any:
    """The template's compiled code: read from the cache, or compiled and kept there (``cache.kept``:
    nothing is read or written when the folder is not private to this user; the code is run)."""
    key = hashlib.sha256(f"{VERSION}\0{jinja2.__version__}\0{sys.version}\0{text}".encode()).hexdigest()
    return cache.kept(CACHE, key, lambda: env.compile(text))
