"""Record the model architectures each catalog llama.cpp build knows: ``tests/fixtures/llamacpp/<build>/arch.txt``,
the ``LLM_ARCH_NAMES`` map of the build's ``src/llama-arch.cpp``, verbatim
(``llmfleet.images.llamacpp_arch``), under a header with the file's address at that tag.

Build tags are read from a git clone of llama.cpp (``git show bNNNN:src/llama-arch.cpp``); a llama.cpp
tree vendored elsewhere (llama-cpp-python's sdist) is given as a file with its address.
tests/test_arch_support.py compares catalog/architectures.yaml with these files.

    .venv/bin/python bench/record_llamacpp_arch.py --git ~/src/llama.cpp b5000 b10573
    .venv/bin/python bench/record_llamacpp_arch.py --file vendored-0.3.36=PATH/llama-arch.cpp \\
        --url "https://pypi.org/project/llama-cpp-python/0.3.36/ (sdist, vendor/llama.cpp/src/llama-arch.cpp)"
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from llmfleet.images import llamacpp_arch  # noqa: E402

FIXTURES = ROOT / "tests" / "fixtures" / "llamacpp"
TAG_URL = "https://github.com/ggml-org/llama.cpp/blob/{tag}/src/llama-arch.cpp"


def write(build: str, text: str, url: str, note: str = "") -> None:
    out = FIXTURES / build
    out.mkdir(parents=True, exist_ok=True)
    excerpt = llamacpp_arch.excerpt(text, build, url, note)
    (out / "arch.txt").write_text(excerpt, encoding="utf-8")
    print(f"{build}: {len(llamacpp_arch.parse_excerpt(excerpt))} architectures")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("tags", nargs="*", help="build tags (bNNNN) to read from --git")
    ap.add_argument("--git", type=Path, help="a git clone of llama.cpp with its build tags")
    ap.add_argument("--file", help="NAME=PATH: a llama-arch.cpp read outside a tag (give --url)")
    ap.add_argument("--url", default="", help="the address of --file")
    args = ap.parse_args()
    for tag in args.tags:
        if args.git is None:
            ap.error("build tags need --git")
        ref = f"refs/tags/{tag}"  # never a commit whose hash happens to start with the tag's name
        commit = subprocess.run(["git", "-C", str(args.git), "rev-parse", f"{ref}^{{commit}}"], check=True,
                                capture_output=True, text=True).stdout.strip()
        text = subprocess.run(["git", "-C", str(args.git), "show", f"{ref}:src/llama-arch.cpp"], check=True,
                              capture_output=True, text=True).stdout
        write(tag, text, TAG_URL.format(tag=tag), f"tag {tag} is commit {commit}")
    if args.file:
        name, _, path = args.file.partition("=")
        write(name, Path(path).read_text(encoding="utf-8"), args.url)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
