"""The Dockerfiles in dockerfiles/: the linter's rules, every Dockerfile passing them, and the engine
images' Dockerfiles agreeing with what catalog/engines.yaml claims about them (CUDA version,
architectures, repository and tag) and with their image.yaml (bases pinned through build args)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from llmfleet.errors import UsageError
from llmfleet.images.lint import RULES, claims, lint, lint_tree, mismatches, parse_arch_list, profile_for
from llmfleet.images.lock import all_build_specs, build_argv, load_build_spec

REPO = Path(__file__).resolve().parents[1]
DOCKERFILES = REPO / "dockerfiles"
CATALOG = yaml.safe_load((REPO / "src/llmfleet/knowledge/catalog/engines.yaml").read_text())["images"]
D = "sha256:" + "ab" * 32

GOOD = f"""\
ARG CUDA_VERSION=12.2.2
ARG BASE_DIGEST
FROM nvidia/cuda:${{CUDA_VERSION}}-devel-ubuntu22.04@${{BASE_DIGEST}} AS build
ARG SRC_COMMIT
RUN apt-get update && apt-get install -y --no-install-recommends git && rm -rf /var/lib/apt/lists/*
RUN git clone --depth 1 --branch v1 https://example.invalid/x.git /src && test "$(git -C /src rev-parse HEAD)" = "$SRC_COMMIT"
RUN pip install --no-cache-dir x==1
FROM debian:bookworm-slim@{D}
COPY --from=build /src /src
ADD --checksum=sha256:{"cd" * 32} https://example.invalid/f.tar.gz /tmp/
USER app
HEALTHCHECK CMD ["curl", "-f", "http://127.0.0.1:8080/health"]
ENTRYPOINT ["/app/server"]
"""


def rules(text: str, profile: str = "fleet") -> set[str]:
    return {f.rule for f in lint(text, "Dockerfile", profile)}


def test_the_good_example_is_clean():
    assert lint(GOOD) == []


@pytest.mark.parametrize(
    ("old", "new", "rule"),
    [
        ("-ubuntu22.04@${BASE_DIGEST}", "-ubuntu22.04", "DF001"),  # base not pinned
        ("ARG BASE_DIGEST\n", "ARG BASE_DIGEST=\n", "DF001"),  # a digest ARG with a default is optional
        (f"debian:bookworm-slim@{D}", "debian:latest", "DF001"),
        (f"debian:bookworm-slim@{D}", "debian:latest", "DF002"),
        (f"debian:bookworm-slim@{D}", "debian", "DF002"),
        ("--checksum=sha256:" + "cd" * 32 + " ", "", "DF003"),  # ADD of a URL without checksum
        ("COPY --from=build /src /src", "ADD app.py /app/", "DF003"),  # ADD of a local file
        (" --no-install-recommends", "", "DF004"),
        (" && rm -rf /var/lib/apt/lists/*", "", "DF005"),
        ("apt-get update &&", "apt-get update && apt-get upgrade -y &&", "DF006"),
        ("USER app\n", "", "DF007"),
        ("USER app\n", "USER root\n", "DF007"),
        ("USER app\n", "USER 0:0\n", "DF007"),
        ('HEALTHCHECK CMD ["curl", "-f", "http://127.0.0.1:8080/health"]\n', "", "DF008"),
        ('HEALTHCHECK CMD ["curl", "-f", "http://127.0.0.1:8080/health"]\n', "HEALTHCHECK NONE\n", "DF008"),
        ("RUN pip install", "RUN curl -fsSL https://example.invalid/i.sh | sh && pip install", "DF009"),
        ("ARG SRC_COMMIT\n", "ARG SRC_COMMIT\nENV HF_TOKEN=abc\n", "DF010"),
        ("ARG SRC_COMMIT\n", "ARG SRC_COMMIT\nARG REGISTRY_PASSWORD\n", "DF010"),
        ('ENTRYPOINT ["/app/server"]', "ENTRYPOINT /app/server --port 8080", "DF011"),
        ("--no-cache-dir ", "", "DF012"),
        (' && test "$(git -C /src rev-parse HEAD)" = "$SRC_COMMIT"', "", "DF013"),
    ],
)
def test_each_rule_fires(old, new, rule):
    assert old in GOOD
    assert rule in rules(GOOD.replace(old, new, 1))


def test_git_clone_then_checkout_of_a_commit_arg_is_pinned():
    text = GOOD.replace(' && test "$(git -C /src rev-parse HEAD)" = "$SRC_COMMIT"',
                        ' && git -C /src checkout "${SRC_COMMIT}"')
    assert "DF013" not in rules(text)


def test_local_profile_skips_the_fleet_only_rules():
    text = "ARG BASE=llmfleet-lab/base:bookworm\nFROM ${BASE}\nRUN apt-get update && apt-get install -y x\n" \
           'ENTRYPOINT ["x"]\n'
    assert rules(text, "local") == {"DF004", "DF005"}
    assert {"DF001", "DF007", "DF008"} <= rules(text, "fleet")
    # a base the build supplies (ARG without default) is not judged; scratch needs nothing
    assert rules('ARG BASE\nFROM ${BASE}\nLABEL a=b\n', "local") == set()
    assert rules('FROM scratch\nCOPY x /x\nENTRYPOINT ["/x"]\n', "local") == set()


def test_a_waiver_needs_a_known_rule_and_a_reason():
    no_hc = GOOD.replace('HEALTHCHECK CMD ["curl", "-f", "http://127.0.0.1:8080/health"]\n', "")
    assert "DF008" not in rules("# lint-ignore DF008: health is probed by the deploy over HTTP\n" + no_hc)
    assert {"DF008", "DF014"} <= rules("# lint-ignore DF008\n" + no_hc)
    assert "DF014" in rules("# lint-ignore DF999: nonsense\n" + GOOD)


def test_continuation_lines_are_one_instruction_with_the_first_line_number():
    text = GOOD.replace("RUN apt-get update && apt-get install -y --no-install-recommends git && rm -rf /var/lib/apt/lists/*",
                        "RUN apt-get update \\\n && apt-get install -y git \\\n && rm -rf /var/lib/apt/lists/*")
    [f] = [f for f in lint(text) if f.rule == "DF004"]
    assert f.line == 5


def test_every_rule_has_a_profile_and_a_summary():
    assert all(p in ("fleet", "all") and summary for p, summary in RULES.values())


def test_every_dockerfile_in_the_repository_passes_the_linter():
    findings = lint_tree(DOCKERFILES)
    assert findings == [], "\n".join(map(str, findings))


def test_engine_images_are_linted_with_the_fleet_profile():
    specs = all_build_specs()
    assert {s.name for s in specs} >= {"llamacpp-cuda", "vllm-volta"}
    for s in specs:
        assert profile_for(s.dir / "Dockerfile") == "fleet"


# ---------------------------------------------------------------- catalog claims vs Dockerfiles


@pytest.mark.parametrize(
    ("arg", "value", "sass", "ptx"),
    [
        ("CUDA_ARCHITECTURES", "60-real;61-real;70-real;75-real;80-real;86-real;89", ["6.0", "6.1", "7.0", "7.5", "8.0", "8.6", "8.9"], ["8.9"]),
        ("CMAKE_CUDA_ARCHITECTURES", "50-virtual;86-real;120a-real", ["8.6", "12.0a"], ["5.0"]),
        ("TORCH_CUDA_ARCH_LIST", "7.0 7.5 8.0+PTX", ["7.0", "7.5", "8.0"], ["8.0"]),
        ("TORCH_CUDA_ARCH_LIST", "7.0;7.5", ["7.0", "7.5"], []),
    ],
)
def test_parse_arch_list(arg, value, sass, ptx):
    assert parse_arch_list(arg, value) == (sass, ptx)


@pytest.mark.parametrize("spec", all_build_specs(), ids=lambda s: s.name)
def test_catalog_claims_match_the_dockerfile(spec):
    rel = CATALOG.get(spec.catalog_key)
    assert rel is not None, f"{spec.name}: image.yaml names {spec.catalog_key}, which catalog/engines.yaml lacks"
    assert (rel["repository"], rel["tag"]) == (spec.repository, spec.tag), "repository:tag differ"
    assert not rel.get("cpu"), "an engine image built here is a GPU image"
    c = claims((spec.dir / "Dockerfile").read_text())
    assert mismatches(c, rel) == []
    # the bases image.yaml pins are the Dockerfile's FROM lines, each pinned through its build arg
    assert {(img, arg) for arg, (img, _) in spec.bases.items()} == set(c.bases)
    for image, _ in c.bases:
        assert str(rel["cuda"]) in image, f"base {image} is not the catalog's CUDA {rel['cuda']}"


@pytest.mark.parametrize("spec", all_build_specs(), ids=lambda s: s.name)
def test_every_build_arg_image_yaml_passes_is_declared_by_the_dockerfile(spec):
    """An arg the Dockerfile does not declare would be ignored by docker build without a word."""
    from llmfleet.images.lint import parse

    instructions, _ = parse((spec.dir / "Dockerfile").read_text())
    declared = {i.args.split("=", 1)[0].strip() for i in instructions if i.cmd == "ARG"}
    passed = set(spec.args) | set(spec.required_args) | set(spec.bases)
    assert passed <= declared, f"not declared in the Dockerfile: {sorted(passed - declared)}"


def test_a_dockerfile_that_drifts_from_the_catalog_is_caught():
    spec = load_build_spec("llamacpp-cuda")
    rel = CATALOG[spec.catalog_key]
    text = (spec.dir / "Dockerfile").read_text()
    dropped = claims(text.replace("61-real;", ""))
    assert any("sass" in m and "6.1" in m for m in mismatches(dropped, rel))
    other_cuda = claims(text.replace("ARG CUDA_VERSION=12.2.2", "ARG CUDA_VERSION=12.4.1"))
    assert any(m.startswith("CUDA") for m in mismatches(other_cuda, rel))
    # a stage that redeclares the list differently is an inconsistency of its own
    split = claims(text.replace('ARG CUDA_ARCHITECTURES="60-real;61-real;70-real;75-real;80-real;86-real;89"\nENV',
                                'ARG CUDA_ARCHITECTURES="70-real"\nENV', 1))
    assert split.problems


def test_an_architecture_arg_that_is_never_passed_to_the_build_is_a_problem():
    text = 'ARG CUDA_VERSION=12.2.2\nARG CUDA_ARCHITECTURES="70-real"\nFROM x@' + D + "\nRUN cmake -S . -B b\n"
    assert any("never passed" in p for p in claims(text).problems)


# ---------------------------------------------------------------- images.build


def test_build_refuses_without_pinned_bases_or_the_source_commit():
    spec = load_build_spec("llamacpp-cuda")
    with pytest.raises(UsageError, match="BASE_DIGEST"):
        build_argv(spec, {"LLAMACPP_COMMIT": "a" * 40})
    with pytest.raises(UsageError, match="LLAMACPP_COMMIT"):
        build_argv(spec, {"BASE_DIGEST": D, "RUNTIME_DIGEST": D})
    with pytest.raises(UsageError, match="must be sha256"):
        build_argv(spec, {"BASE_DIGEST": "sha256:short", "RUNTIME_DIGEST": D, "LLAMACPP_COMMIT": "a" * 40})


def test_build_command_names_the_catalog_tag_and_records_the_bases():
    spec = load_build_spec("vllm-volta")
    argv = build_argv(spec, {"BASE_DIGEST": D, "RUNTIME_DIGEST": D, "VLLM_COMMIT": "b" * 40})
    assert argv[:3] == ["docker", "build", "-t"]
    assert argv[3] == f"{CATALOG['vllm:0.19.1-volta']['repository']}:{CATALOG['vllm:0.19.1-volta']['tag']}"
    assert f"BASE_DIGEST={D}" in argv and f"VLLM_COMMIT={'b' * 40}" in argv
    assert f"io.llmfleet.base.base-digest=nvidia/cuda:12.6.3-devel-ubuntu22.04@{D}" in argv
    assert argv[-1] == str(spec.dir)


def test_unknown_build_name_lists_the_known_ones():
    with pytest.raises(UsageError, match="llamacpp-cuda"):
        load_build_spec("nope")
    with pytest.raises(UsageError):
        load_build_spec("../lab-host")
