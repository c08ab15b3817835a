"""Task outcomes a user relies on (issue 39): the answers tasks give on careless input, table-driven."""

from __future__ import annotations

import pytest

from llmfleet.knowledge.planner import PlanRequest, plan


@pytest.mark.parametrize(
    ("gpu", "engine", "quant", "served"),
    [
        ("p40", "vllm", None, False),  # compute capability 6.1: below every vLLM image
        ("p40", None, None, False),  # vLLM by default for a 16-bit model
        ("p40", "llamacpp", "q4_k_m", True),
        ("v100-sxm2-32gb", "vllm", None, True),
        ("rtx-4090", "vllm", None, True),
    ],
)
def test_a_plan_for_an_engine_without_an_image_for_the_card_is_refused(gpu, engine, quant, served):
    p = plan(PlanRequest(model="qwen2.5-7b", gpu=gpu, engine=engine, quant=quant))
    first = p.notes[0] if p.notes else ""
    refused = first.startswith("REFUSED: no ")
    assert refused is not served
    if not served:
        assert not p.fits and p.image is None
        # the engine's catalog minimum, its source, and what serves the card instead
        assert "compute capability 7.0 or higher" in first and "docs.vllm.ai" in first
        assert "--engine llamacpp" in first


V100S = ["v100-sxm2-32gb", "v100-sxm2-16gb", "v100-pcie-32gb", "v100-pcie-16gb", "v100s-pcie-32gb"]
A100S = ["a100-sxm4-40gb", "a100-pcie-40gb", "a100-sxm4-80gb", "a100-pcie-80gb"]


@pytest.mark.parametrize(
    ("typed", "suggested"),
    [
        ("v100", V100S),  # every V100 variant
        ("Tesla V100", V100S),  # nvidia-smi's vendor word: not 'Tesla P40'
        ("NVIDIA V100", V100S),
        ("a100", A100S),  # the A100s, not the A10
        ("NVIDIA A100", A100S),
        ("h200", ["h200-141gb", "h200-nvl-141gb"]),
        ("H100", ["h100-sxm-80gb", "h100-pcie-80gb"]),
        ("4090", ["rtx-4090"]),
        ("rtx 3090", ["rtx-3090", "rtx-3090-ti"]),
        ("a10o", []),  # a typo, not a family: the close match below
        ("x", []),
    ],
)
def test_card_family_and_prefix_matches(typed, suggested):
    from llmfleet.knowledge.catalog import gpu_family_matches, load_gpus

    assert gpu_family_matches(typed, load_gpus()) == suggested


@pytest.mark.parametrize(
    ("typed", "named", "not_named"),
    [
        ("v100", V100S, ["p40"]),
        ("Tesla V100", V100S, ["Tesla P40", "p40"]),
        ("a100", A100S, ["a10"]),
        ("h200", ["h200-141gb", "h200-nvl-141gb"], []),
        ("H100", ["h100-sxm-80gb", "h100-pcie-80gb"], []),
        ("a10o", ["a10"], []),
    ],
)
def test_an_unknown_card_says_did_you_mean_with_its_family(typed, named, not_named):
    from llmfleet.errors import UsageError
    from llmfleet.knowledge.catalog import find_gpu

    with pytest.raises(UsageError) as e:
        find_gpu(typed)
    hint = str(e.value).split("did you mean", 1)[1].split("?")[0]
    for n in named:
        assert f"'{n}'" in hint
    for n in not_named:
        assert f"'{n}'" not in hint


@pytest.mark.parametrize(
    ("raised", "code"),
    [("usage", 2), ("check", 1), ("remote", 1), ("exit", 1)],
)
def test_a_json_task_that_ends_on_an_error_prints_one_json_document(capsys, raised, code):
    import json

    from invoke.exceptions import Exit

    from llmfleet.cli.common import handles_errors
    from llmfleet.errors import CheckFailed, RemoteError, UsageError

    errors = {"usage": UsageError("no host 'x'"), "check": CheckFailed("no host 'x'"),
              "remote": RemoteError("no host 'x'"), "exit": Exit("error: no host 'x'", code=1)}

    @handles_errors
    def task(c, json=False):
        raise errors[raised]

    with pytest.raises(Exit) as e:
        task(None, json=True)
    assert e.value.code == code
    assert json.loads(capsys.readouterr().out) == {"error": "no host 'x'", "exit": code}
    with pytest.raises(Exit):
        task(None, json=False)  # without --json: the line on stderr only
    assert capsys.readouterr().out == ""


def test_a_json_task_that_printed_its_document_prints_no_second_one(capsys):
    import json

    from invoke.exceptions import Exit

    from llmfleet.cli.common import handles_errors, print_json
    from llmfleet.errors import CheckFailed

    @handles_errors
    def task(c, json=False):
        print_json({"fits": False})
        raise CheckFailed("does not fit")

    with pytest.raises(Exit):
        task(None, json=True)
    assert json.loads(capsys.readouterr().out) == {"fits": False}


def _vr(key, status, message=""):
    from llmfleet.images.lock import VerifyResult

    return VerifyResult(key, f"r/{key}", status, message)


_UNREACH = "registry-1.docker.io: cannot reach registry: ConnectError: [Errno -2] Name or service not known"


@pytest.mark.parametrize(
    ("results", "says", "never"),
    [
        # one pinned of many entries, no network: the count is of pinned entries, the cause is the network
        ([_vr("a", "unpinned"), _vr("b", "unpinned"), _vr("vllm:0.10.1.1", "error", _UNREACH)],
         ["1 of 1 pinned image could not be checked", "registry unreachable", "registry-1.docker.io",
          "Name or service not known", "vllm:0.10.1.1"], ["do not resolve", "of 3"]),
        ([_vr("a", "missing", "digest no longer in the registry"), _vr("b", "ok")],
         ["1 of 2 pinned images do not resolve", "digest gone", ": a"], ["unreachable"]),
        ([_vr("a", "missing"), _vr("b", "error", "127.0.0.1:1: cannot reach registry: ConnectError: refused"),
          _vr("c", "error", "r/c: access denied by r; check `docker login r`")],
         ["1 of 3 pinned images do not resolve", "registry unreachable (127.0.0.1:1:", "c (r/c: access denied"],
         []),
    ],
)
def test_images_verify_fails_with_the_count_of_pinned_images_and_the_cause(results, says, never):
    from llmfleet.cli.images_tasks import verify_failure_line

    line = verify_failure_line(results)
    assert "\n" not in line
    for s in says:
        assert s in line
    for s in never:
        assert s not in line


@pytest.mark.parametrize("image", ["vllm:0.19.1", "vllm:9.9.9", "vllm/vllm-openai:latest"])
def test_a_refusal_names_allow_unpinned_only_for_a_task_that_takes_it(image):
    from llmfleet.errors import UsageError
    from llmfleet.images.lock import ImageLock, LockedImage, resolve

    lock = ImageLock(images={"vllm:0.19.1": LockedImage(key="vllm:0.19.1", repository="docker.io/vllm/vllm-openai", tag="v0.19.1",
                                                        digest=None)}, path="images.lock")
    with pytest.raises(UsageError) as deploy:
        resolve(image, lock)
    assert "--allow-unpinned" in str(deploy.value)
    with pytest.raises(UsageError) as bundle:
        resolve(image, lock, unpinned_flag=False)  # bundle.create: pinned images only
    assert "--allow-unpinned" not in str(bundle.value) and "images.pin" in str(bundle.value)


@pytest.mark.parametrize(("prog", "shown"), [("llmfleet", "`llmfleet speed --group G`"),
                                             ("invoke", "`invoke speed --group G`")])
def test_printed_hints_name_the_command_typed(capsys, monkeypatch, prog, shown):
    from llmfleet.cli import flags
    from llmfleet.cli.common import _LazyConsole, log_line

    monkeypatch.setattr(flags, "PROG", prog)
    _LazyConsole(stderr=False).print("no host read now: run `invoke speed --group G`")
    assert shown in capsys.readouterr().out
    log_line("run `invoke speed --group G`")
    assert shown in capsys.readouterr().err
