"""``invoke catalog.release vllm==X``: draft a catalog entry from what an engine release publishes."""

from __future__ import annotations

from pathlib import Path

from invoke import Collection

from llmfleet.cli.flags import fleet_task


@fleet_task(
    positional=["spec"],
    help={
        "spec": "the release: vllm==VERSION (vllm==0.33.0), or llamacpp@TAG (llamacpp@b7000) with --source",
        "write": "add the draft to this draft file (YAML; created if absent) instead of printing it; "
                 "never the packaged catalog",
        "json": "print the draft as JSON: key, entry, provenance (field -> source, confidence), libraries, "
                "not_drafted",
        "wheel": "read this vLLM wheel instead of downloading it",
        "torch_wheel": "read this torch wheel instead of downloading the one the vLLM wheel pins",
        "no_torch": "do not read the torch wheel (the torch arch list is left out, confidence U)",
        "source": "llamacpp@TAG: a checkout of the tag (git clone --depth 1 --branch TAG of ggml-org/llama.cpp); "
                  "its .devops/cuda.Dockerfile and ggml-cuda CMake defaults are read",
    },
)
def release(c, spec, write=None, json=False, wheel=None, torch_wheel=None, no_torch=False, source=None):
    """Draft an engines.yaml entry from a release's published files: the vLLM wheel's torch pin (METADATA)
    and the kernel architectures of its CUDA libraries, the torch wheel's CUDA and arch list; for a
    llama.cpp tag, its CUDA Dockerfile and CMake default architectures; every field with its source
    and confidence. Wheels are downloaded with `pip download --no-deps` into a temporary
    folder and removed after reading. Bad input (no such release, no network, a wheel without CUDA
    kernels) is one line, exit 2, and nothing written."""
    from llmfleet.cli.common import print_json
    from llmfleet.errors import UsageError
    from llmfleet.images import published
    from llmfleet.images import release_draft as rd
    from llmfleet.knowledge import compat

    for name, value in (("--wheel", wheel), ("--torch-wheel", torch_wheel)):
        if value is not None and not Path(value).is_file():
            raise UsageError(f"{name} {value}: no such file")
    if write is not None and Path(write).resolve() == compat.ENGINES_PATH.resolve():
        raise UsageError(f"--write {write}: the packaged catalog is not written by catalog.release; give a draft file")
    toolkits = compat.load_engine_catalog().cuda_toolkits
    tag = rd.parse_llamacpp_spec(spec)
    if tag is not None:
        if source is None or not Path(source).is_dir():
            raise UsageError(f"{spec}: give --source DIR, a checkout of the tag (git clone --depth 1 --branch {tag} "
                             "of ggml-org/llama.cpp)" + (f"; {source} is not a folder" if source else ""))
        draft = rd.draft_llamacpp(tag, published.read_llamacpp_checkout(Path(source)), toolkits, where=str(source))
    else:
        from llmfleet.cli.common import err_console

        with err_console.status(f"{spec}: drafting") as shown:
            def progress(line: str, done: bool) -> None:
                shown.update(line)  # the spinner's line, on a terminal
                if done:  # a finished download stays in the output (a failed one is the error's one line)
                    err_console.print(line)

            draft = published.draft_release(spec, toolkits, wheel=Path(wheel) if wheel else None,
                                            torch_wheel=Path(torch_wheel) if torch_wheel else None,
                                            with_torch=not no_torch, progress=progress)
    if write is not None:
        published.write_draft(Path(write), draft, compat.ENGINES_PATH)
        if json:
            print_json({**draft, "written": str(write)})
        else:
            print(f"{draft['key']}: draft written to {write}")
        return
    if json:
        print_json(draft)
    else:
        print(rd.render_drafts([draft]), end="")


ns = Collection("catalog")
ns.add_task(release)
