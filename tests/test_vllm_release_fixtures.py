"""What the catalog says of each vLLM release from 0.20.0 on is what that release's own code says,
as recorded per release in tests/fixtures/vllm/<version>/rules.txt: verbatim excerpts of the published
wheel (bench/record_vllm_rules.py; its header names the wheel and the tag), read with
llmfleet.images.vllm_rules: the quantization methods of ``QuantizationMethods``
(vllm/model_executor/layers/quantization/__init__.py) and the backends' lower compute-capability
bounds (``supports_compute_capability``). A method or floor the catalog claims that its release's
fixture does not hold fails here, and so does a release without a fixture; so do the GGUF and
bitsandbytes removals (RFC vllm#39583), FLASHINFER's 8.0 floor from 0.24.0 (vllm PR #45375,
vllm#47549) and NVFP4 from compute capability 7.5 in preflight and plan. The KV dtypes each catalog
backend lists must be ones its release's backend accepts, and the compute capabilities it gives fp8 KV
no wider than the release's own fp8 test (FA3's ``is_device_capability_family(90)``, Triton's
``has_device_capability(89)`` from 0.24), and confirmed wherever that test was read."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from llmfleet.knowledge import compat
from llmfleet.knowledge.planner import PlanRequest, plan

FIXTURES = Path(__file__).parent / "fixtures" / "vllm"
CAT = compat.load_engine_catalog()
RULES = CAT.engines["vllm"]
# the catalog's method names -> the release's --quantization / QuantizationMethods name
CATALOG_TO_VLLM: dict[str, str] = {"int8_w8a8": "compressed-tensors"}
for flag, methods in RULES.quantization_flag.items():
    for m in [methods] if isinstance(methods, str) else methods:
        if m != "from-quant":
            CATALOG_TO_VLLM.setdefault(m, flag)
TRACKED = set(CATALOG_TO_VLLM.values())


def _v(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split("."))


RELEASES = {k: r for k, r in CAT.images.items()
            if r.engine == "vllm" and re.fullmatch(r"\d+(\.\d+)+", r.version) and _v(r.version) >= (0, 20)}


def _rules(version: str):
    from llmfleet.images.vllm_rules import parse_excerpt

    return parse_excerpt((FIXTURES / version / "rules.txt").read_text(encoding="utf-8"))


def _fixture(version: str) -> tuple[set[str], dict[str, str], list[str]]:
    """(the release's methods llmfleet maps, each backend's floor as read, the header lines)."""
    text = (FIXTURES / version / "rules.txt").read_text(encoding="utf-8")
    rules = _rules(version)
    floors = {k: v for k, v in rules.floors.items() if v is not None}
    return set(rules.methods) & TRACKED, floors, text.splitlines()[:1]


def test_every_catalog_vllm_release_from_0_20_has_a_fixture_and_every_fixture_a_release():
    have = {p.name for p in FIXTURES.iterdir() if p.is_dir()}
    every = {r.version for r in CAT.images.values() if r.engine == "vllm" and re.fullmatch(r"\d+(\.\d+)+", r.version)}
    assert {r.version for r in RELEASES.values()} <= have <= every


@pytest.mark.parametrize("key", sorted(RELEASES, key=lambda k: _v(RELEASES[k].version)))
def test_the_catalog_claims_only_what_the_release_fixture_holds(key):
    rel = RELEASES[key]
    methods, floors, headers = _fixture(rel.version)
    for h in headers:  # each fixture names the wheel and the release tag
        assert f"vllm-{rel.version}-" in h and f"https://github.com/vllm-project/vllm/tree/v{rel.version}" in h, h
    assert methods <= TRACKED, f"{key}: fixture names a method llmfleet does not map: {methods - TRACKED}"
    for m in rel.quantizations:
        if m == "none":
            continue
        name = CATALOG_TO_VLLM.get(m)
        assert name is not None, f"{key}: catalog method {m!r} has no --quantization name"
        assert name in methods, f"{key}: catalog lists {m} ({name}) but {rel.version}'s QuantizationMethods has no {name}"
    listed = {CATALOG_TO_VLLM[m] for m in rel.quantizations if m in CATALOG_TO_VLLM}
    missing = methods - listed
    assert not missing, f"{key}: {rel.version} has {sorted(missing)}, the catalog lists none of their methods"
    backends = rel.attention.backends if rel.attention is not None else {}
    for name, floor in floors.items():
        if name not in backends:
            continue  # a backend llmfleet does not offer (its preflight refuses it as unknown)
        # "any": the backend accepts every card; the release's own floor (v1_min_cc, its kernels) is the bound
        want = rel.v1_min_cc if floor == "any" else floor
        assert backends[name].min_cc == want, f"{key}: {name} min_cc {backends[name].min_cc}, the release says {floor}"
    for name in ("FLASH_ATTN", "FLASHINFER", "TRITON_ATTN"):
        assert name not in backends or name in floors, f"{key}: the catalog has {name}, the release's excerpt not"


@pytest.mark.parametrize("key", sorted(RELEASES, key=lambda k: _v(RELEASES[k].version)))
def test_no_catalog_floor_is_below_the_release_s_own_get_min_capability(key):
    rel = RELEASES[key]
    caps = _rules(rel.version).min_capability
    for m, floor in rel.quantizations.items():
        name = CATALOG_TO_VLLM.get(m)
        if name in caps:
            assert _v(floor) >= _v(caps[name]), f"{key}: {m} from {floor}, but {name}'s get_min_capability is {caps[name]}"


@pytest.mark.parametrize("method", sorted(RULES.quant_removed))
def test_a_removed_method_is_absent_from_its_release_on_and_last_names_the_newest_with_it(method):
    gone = RULES.quant_removed[method]
    name = CATALOG_TO_VLLM[method]
    for key, rel in RELEASES.items():
        methods, _, _ = _fixture(rel.version)
        after = _v(rel.version) >= _v(gone.removed_in)
        assert (name in methods) is not after, f"{key}: fixture and removed_in {gone.removed_in} disagree"
        assert (method in rel.quantizations) is not after, f"{key}: catalog and removed_in {gone.removed_in} disagree"
    with_it = [k for k, r in CAT.images.items() if r.engine == "vllm" and method in r.quantizations
               and re.fullmatch(r"\d+(\.\d+)+", r.version)]
    assert gone.last == max(with_it, key=lambda k: _v(CAT.images[k].version))
    assert "github.com/vllm-project/vllm/issues/39583" in gone.source


@pytest.mark.parametrize("key,method,status", [
    ("vllm:0.23.0", "gguf", "pass"), ("vllm:0.24.0", "gguf", "fail"), ("vllm:0.34.0", "gguf", "fail"),
    ("vllm:0.27.1", "bitsandbytes", "pass"), ("vllm:0.28.0", "bitsandbytes", "fail"),
])
def test_preflight_fails_a_vllm_release_without_the_model_s_quantization_and_names_the_last_with_it(key, method, status):
    quant = {"gguf": "q4_k_m", "bitsandbytes": "bnb-int4"}[method]
    v = compat.check_quantization(CAT.images[key], RULES, quant, [], "7.5")
    assert v.status == status, v
    if status == "fail":
        gone = RULES.quant_removed[method]
        assert f"{method} is not in this release: removed in {gone.removed_in}" in v.message
        assert f"--image {gone.last}" in v.fix
    # the flag says the same as the service's quant
    flag = compat.check_quantization(CAT.images[key], RULES, None, ["--quantization", method], "7.5")
    assert flag.status == status


def test_plan_refuses_gguf_on_the_newest_vllm_and_names_the_last_release_with_it():
    p = plan(PlanRequest(model="qwen2.5-7b-instruct", gpu="t4", engine="vllm", quant="q4_k_m"))
    assert not p.fits and "--quantization" not in p.engine_args
    refused = next(n for n in p.notes if n.startswith("REFUSED"))
    assert "gguf is not in this release: removed in 0.24.0" in refused and "--image vllm:0.23.0" in refused
    old = plan(PlanRequest(model="qwen2.5-7b-instruct", gpu="t4", engine="vllm", quant="q4_k_m", image="vllm:0.23.0"))
    assert old.fits and old.image == "vllm:0.23.0"


@pytest.mark.parametrize("key", ["vllm:0.24.0", "vllm:0.33.0", "vllm:0.34.0"])
@pytest.mark.parametrize("cc,status", [("7.5", "fail"), ("8.0", "pass"), ("8.9", "pass")])
def test_flashinfer_needs_8_0_from_0_24(key, cc, status):
    v = compat.check_attention(CAT.images[key], ["--attention-backend", "FLASHINFER"], {}, cc)
    assert v.status == status, v


def test_flashinfer_ran_on_turing_up_to_0_23():
    assert compat.check_attention(CAT.images["vllm:0.23.0"], ["--attention-backend", "FLASHINFER"], {}, "7.5").status == "pass"


@pytest.mark.parametrize("key", ["vllm:0.24.0", "vllm:0.34.0"])
def test_no_fp8_kv_fix_on_a_t4_recommends_flashinfer_from_0_24(key):
    v = compat.check_kv_dtype(CAT.images[key], RULES, "fp8", [], {}, "7.5")
    assert v.status == "fail" and "FLASHINFER" not in (v.fix or "") + v.message, v


@pytest.mark.parametrize("key,cc,status", [
    ("vllm:0.19.1", "7.5", "pass"), ("vllm:0.34.0", "7.5", "pass"), ("vllm:0.34.0", "8.6", "pass"),
    ("vllm:0.19.1", "7.0", "fail"),
])
def test_nvfp4_runs_from_7_5(key, cc, status):
    for quant, args in (("nvfp4", []), (None, ["--quantization", "modelopt_fp4"])):
        v = compat.check_quantization(CAT.images[key], RULES, quant, args, cc)
        assert v.status == status, (quant, v)


# --- KV-cache dtypes and the fp8 KV guards, read from each release's backends ----------------------
CCS = ("7.0", "7.5", "8.0", "8.6", "8.7", "8.9", "9.0", "10.0", "10.3", "11.0", "12.0", "12.1")


def _guard_runs(guard: str, cc: str) -> bool:
    """Whether a read fp8 guard ("9.0-9.9", "8.9+", "any", "a,b": either) admits ``cc``."""
    t = compat.cc_tuple(cc)
    assert t is not None
    return any(compat.cc_in_spec(t, part)[0] for part in guard.split(","))


def kv_problems(key: str, backends: dict[str, compat.Backend], rules) -> list[str]:
    """What the catalog's ``attention.backends`` of one release claims of KV dtypes that the release's
    code does not: a dtype the backend does not accept ("fp8" and "fp8_e4m3" are one dtype in vLLM), an
    fp8 compute capability the backend's guard refuses, an unconfirmed ("?") claim where the code was
    read, or a confirmed one where it was not."""
    from llmfleet.images.vllm_rules import ALIASES, FP8

    out: list[str] = []
    for name, b in backends.items():
        if name not in rules.kv_dtypes:
            continue  # the release's excerpt states no KV dtypes for it (a backend it does not have)
        accepted = rules.kv_dtypes[name]
        for d in b.kv_dtypes:
            if accepted is not None and d not in accepted and ALIASES.get(d) not in accepted:
                out.append(f"{key}: {name} lists KV dtype {d}, the release's backend accepts {sorted(accepted)}")
        guard = rules.kv_fp8_cc.get(name)
        for d in (d for d in b.kv_dtypes if d in FP8):
            spec = b.kv_cc.get(d, "any")  # not in kv_cc: wherever the backend runs
            if guard is None:
                if not spec.endswith("?"):
                    out.append(f"{key}: {name} {d} on {spec} is confirmed, the release's fp8 test is not read")
                continue
            if spec.endswith("?"):
                out.append(f"{key}: {name} {d} on {spec} is unconfirmed, the release's code says {guard}")
            for cc in CCS:
                if compat.cc_tuple(cc) < compat.cc_tuple(b.min_cc):  # type: ignore[operator]
                    continue
                if compat.cc_in_spec(compat.cc_tuple(cc), spec)[0] and not _guard_runs(guard, cc):  # type: ignore[arg-type]
                    out.append(f"{key}: {name} {d} on {cc} per the catalog ({spec}), the release's code says {guard}")
    return out


@pytest.mark.parametrize("key", sorted(RELEASES, key=lambda k: _v(RELEASES[k].version)))
def test_the_catalog_s_kv_dtypes_and_fp8_kv_capabilities_are_what_the_release_s_code_accepts(key):
    rel = RELEASES[key]
    rules = _rules(rel.version)
    backends = rel.attention.backends if rel.attention is not None else {}
    assert not kv_problems(key, backends, rules)
    for name in ("FLASH_ATTN", "FLASHINFER", "TRITON_ATTN"):  # each read, so the check above bites
        assert name not in backends or (name in rules.kv_dtypes and rules.kv_fp8_cc.get(name)), (key, name)


def _b(min_cc: str, dtypes: list[str], kv_cc: dict[str, str]) -> compat.Backend:
    return compat.Backend.model_validate({"min_cc": min_cc, "kv_dtypes": dtypes, "kv_cc": kv_cc})


@pytest.mark.parametrize("version,name,backend,wrong", [
    # FLASH_ATTN never took fp8_e5m2 (0.22 on: only ("fp8", "fp8_e4m3"); 0.29 on: the list without it)
    ("0.26.0", "FLASH_ATTN", _b("8.0", ["auto", "fp8_e5m2"], {"fp8_e5m2": "9.0-9.9"}), "lists KV dtype fp8_e5m2"),
    ("0.34.0", "FLASH_ATTN", _b("8.0", ["auto", "fp8_e5m2"], {"fp8_e5m2": "9.0-9.9"}), "lists KV dtype fp8_e5m2"),
    # FA's fp8 is Hopper's FA3 (is_device_capability_family(90)) and, from 0.27, Blackwell's FA4: not Ada
    ("0.26.0", "FLASH_ATTN", _b("8.0", ["auto", "fp8"], {"fp8": "8.9+"}), "on 8.9 per the catalog"),
    ("0.34.0", "FLASH_ATTN", _b("8.0", ["auto", "fp8"], {"fp8": "any"}), "on 8.0 per the catalog"),
    # Triton refuses fp8 below SM89 from 0.24 (has_device_capability(89), vllm PR #43914)
    ("0.24.0", "TRITON_ATTN", _b("7.5", ["auto", "fp8"], {"fp8": "any"}), "on 7.5 per the catalog"),
    ("0.34.0", "TRITON_ATTN", _b("7.5", ["auto", "fp8"], {}), "on 8.6 per the catalog"),
    # read: FLASHINFER's fp8 has no capability test, so an unconfirmed "any?" is stale
    ("0.34.0", "FLASHINFER", _b("8.0", ["auto", "fp8"], {"fp8": "any?"}), "is unconfirmed, the release's code says any"),
    # FLEX_ATTENTION takes no fp8 KV at all
    ("0.34.0", "FLEX_ATTENTION", _b("7.5", ["auto", "fp8"], {}), "lists KV dtype fp8"),
])
def test_a_kv_claim_the_release_s_code_does_not_make_is_found(version, name, backend, wrong):
    problems = kv_problems(f"vllm:{version}", {name: backend}, _rules(version))
    assert any(wrong in p for p in problems), problems


@pytest.mark.parametrize("version,name,backend", [
    ("0.34.0", "FLASH_ATTN", _b("8.0", ["auto", "fp8", "fp8_e4m3"], {"fp8": "9.0-9.9", "fp8_e4m3": "9.0-9.9"})),
    ("0.23.0", "TRITON_ATTN", _b("7.5", ["auto", "fp8_e5m2"], {"fp8_e5m2": "8.9+"})),  # stricter than the code: kept
    ("0.34.0", "FLASHINFER", _b("8.0", ["auto", "fp8", "fp8_e5m2"], {"fp8": "any"})),
])
def test_a_kv_claim_the_release_s_code_makes_passes(version, name, backend):
    assert kv_problems(f"vllm:{version}", {name: backend}, _rules(version)) == []
