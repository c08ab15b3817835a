"""Record what each catalog llama.cpp build's source says about CUDA flash attention and GGUF tensor
types: ``tests/fixtures/llamacpp/<build>/fattn.txt`` (the vector flash-attention dispatch of
``ggml/src/ggml-cuda/fattn.cu``, the K/V type rules and ggml-cuda.cu's supports_op case, verbatim) and
``ggml_types.txt`` (``enum ggml_type`` of ``ggml/include/ggml.h``), read by
``llmfleet.images.llamacpp_rules``, under a header with the files' addresses at that tag.

Build tags are read from a git clone of llama.cpp (``git show bNNNN:PATH``); a llama.cpp tree vendored
elsewhere (llama-cpp-python's sdist) is given as a directory with its address.
tests/test_llamacpp_rules.py compares catalog/engines.yaml and catalog/architectures.yaml with them.

    .venv/bin/python bench/record_llamacpp_rules.py --git ~/src/llama.cpp b5000 b6095 b6096 b10573
    .venv/bin/python bench/record_llamacpp_rules.py --tree vendored-0.3.36=PATH/vendor/llama.cpp \\
        --url "https://pypi.org/project/llama-cpp-python/0.3.36/ (sdist, vendor/llama.cpp)"
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from llmfleet.images import llamacpp_rules  # noqa: E402

FIXTURES = ROOT / "tests" / "fixtures" / "llamacpp"
URL = "https://github.com/ggml-org/llama.cpp/blob/{tag}/{path}"
FATTN = "ggml/src/ggml-cuda/fattn.cu"
COMMON = "ggml/src/ggml-cuda/fattn-common.cuh"
CUDA = "ggml/src/ggml-cuda/ggml-cuda.cu"
GGML_H = "ggml/include/ggml.h"


def write(build: str, read: Callable[[str], str], url: Callable[[str], str], note: str = "") -> None:
    out = FIXTURES / build
    out.mkdir(parents=True, exist_ok=True)
    types = llamacpp_rules.types_excerpt(read(GGML_H), build, url(GGML_H), note)
    (out / "ggml_types.txt").write_text(types, encoding="utf-8")
    fattn = read(FATTN) + "\n" + read(COMMON)  # on_no_fattn_vec_case (the abort) lives in fattn-common.cuh
    excerpt = llamacpp_rules.fattn_excerpt(fattn, read(CUDA), build, url(FATTN), url(CUDA),
                                           "; ".join(x for x in (note, f"on_no_fattn_vec_case: {url(COMMON)}") if x))
    (out / "fattn.txt").write_text(excerpt, encoding="utf-8")
    print(f"{build}: {len(llamacpp_rules.parse_types_excerpt(types))} ggml types; "
          f"{llamacpp_rules.parse_fattn_excerpt(excerpt)}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("tags", nargs="*", help="build tags (bNNNN) to read from --git")
    ap.add_argument("--git", type=Path, help="a git clone of llama.cpp with its build tags (or its git directory)")
    ap.add_argument("--tree", help="NAME=DIR: a llama.cpp tree read outside a tag (give --url)")
    ap.add_argument("--url", default="", help="the address of --tree")
    args = ap.parse_args()
    for tag in args.tags:
        if args.git is None:
            ap.error("build tags need --git")
        git = ["git", "--git-dir", str(args.git if (args.git / "HEAD").exists() else args.git / ".git")]
        ref = f"refs/tags/{tag}"  # never a commit whose hash happens to start with the tag's name
        commit = subprocess.run([*git, "rev-parse", f"{ref}^{{commit}}"], check=True, capture_output=True,
                                text=True).stdout.strip()

        def read(path: str, ref: str = ref, git: list[str] = git) -> str:
            r = subprocess.run([*git, "show", f"{ref}:{path}"], capture_output=True, text=True)
            return r.stdout if r.returncode == 0 else ""

        write(tag, read, lambda p, tag=tag: URL.format(tag=tag, path=p), f"tag {tag} is commit {commit}")
    if args.tree:
        name, _, path = args.tree.partition("=")

        def read_tree(p: str) -> str:
            f = Path(path) / p
            return f.read_text(encoding="utf-8") if f.exists() else ""

        write(name, read_tree, lambda p: f"{args.url}: {p}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
