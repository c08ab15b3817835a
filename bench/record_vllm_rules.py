"""Record what each vLLM release's own code says of its quantization methods, attention backends'
compute-capability floors and the architectures its model registry serves:
``tests/fixtures/vllm/<version>/rules.txt``, the verbatim excerpts ``llmfleet.images.vllm_rules`` reads
(``QuantizationMethods``; each backend's ``get_name`` and ``supports_compute_capability``, its
``supported_kv_cache_dtypes``, ``supports_kv_cache_dtype`` and fp8 ``if ... raise`` guards, and the fa_utils
helpers they call (``flash_attn_supports_fp8``...); the keys of
registry.py's ``_TEXT_GENERATION_MODELS`` and ``_MULTIMODAL_MODELS``, one a line), taken from the
release's published wheel.

The wheels come through pip (``pip download --no-deps``, this machine's configured index) into the
build cache (``<cache>/wheels``); a wheel already there is not fetched again. tests/test_vllm_release_fixtures.py
compares the catalog with these files.

    .venv/bin/python bench/record_vllm_rules.py 0.20.0 0.34.0 ...   # default: every catalog vLLM release
"""

from __future__ import annotations

import argparse
import re
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from llmfleet.images import published, vllm_rules  # noqa: E402
from llmfleet.knowledge import compat  # noqa: E402
from llmfleet.lab.paths import cache_dir  # noqa: E402

FIXTURES = ROOT / "tests" / "fixtures" / "vllm"


def catalog_versions() -> list[str]:
    cat = compat.load_engine_catalog()
    out = {r.version for r in cat.images.values() if r.engine == "vllm" and re.fullmatch(r"\d+(\.\d+)+", r.version)}
    return sorted(out, key=lambda v: tuple(map(int, v.split("."))))


def wheel_for(version: str, dest: Path) -> Path:
    have = sorted(dest.glob(f"vllm-{version}-*.whl"))
    if not have:  # fetch_wheel names the first wheel of dest, which may be another release's
        published.fetch_wheel(f"vllm=={version}", dest)
        have = sorted(dest.glob(f"vllm-{version}-*.whl"))
    return have[0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("versions", nargs="*")
    args = ap.parse_args()
    dest = cache_dir() / "wheels"
    dest.mkdir(parents=True, exist_ok=True)
    for version in args.versions or catalog_versions():
        wheel = wheel_for(version, dest)
        with zipfile.ZipFile(wheel) as z:
            files = {n: z.read(n).decode("utf-8", "replace") for n in z.namelist()
                     if n == vllm_rules.REGISTRY or n in vllm_rules.HELPERS
                     or (n.endswith(".py") and n.startswith((vllm_rules.QUANT_DIR, vllm_rules.BACKENDS_DIR)))}
        text = vllm_rules.excerpt(files, version, wheel.name)
        out = FIXTURES / version
        out.mkdir(parents=True, exist_ok=True)
        for old in out.glob("*.txt"):
            old.unlink()
        (out / "rules.txt").write_text(text, encoding="utf-8")
        rules = vllm_rules.parse_excerpt(text)
        print(f"{version}: {len(rules.methods)} quantization methods ({len(rules.min_capability)} with a floor: "
              + ", ".join(f"{k} {v}" for k, v in sorted(rules.min_capability.items())) + "); backends "
              + ", ".join(f"{k} {v}" for k, v in sorted(rules.floors.items()) if v)
              + f"; {len(rules.architectures)} registry architectures; fp8 KV "
              + ", ".join(f"{k} {v}" for k, v in sorted(rules.kv_fp8_cc.items())))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
