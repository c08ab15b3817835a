"""The container toolkit's NVIDIA_REQUIRE_CUDA known before `invoke images.inspect`: each catalog GPU
image's nvidia/cuda base and that base's string (catalog/cuda_bases.yaml), judged as the toolkit does,
and the planner's default image on a GeForce card whose driver the toolkit refuses."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from llmfleet.knowledge import compat, preflight
from llmfleet.knowledge.catalog import find_gpu
from llmfleet.knowledge.planner import PlanRequest, plan

ROOT = Path(__file__).resolve().parents[1]
CATALOG = ROOT / "src" / "llmfleet" / "knowledge" / "catalog"
# read as plain YAML: the facts themselves, whatever the code makes of them
BASES = yaml.safe_load((CATALOG / "cuda_bases.yaml").read_text(encoding="utf-8"))
ENGINES = yaml.safe_load((CATALOG / "engines.yaml").read_text(encoding="utf-8"))["images"]
GPU_IMAGES = [k for k, v in ENGINES.items() if not v.get("cpu") and v.get("cuda")]


def base_string(key: str) -> str | None:
    """The NVIDIA_REQUIRE_CUDA the catalog gives an image (None: none, or not known)."""
    base = BASES["images"][key]["base_image"]
    m = re.search(r"nvidia/cuda:(\d+\.\d+\.\d+)-", base or "")
    row = BASES["bases"].get(m.group(1)) if m else None
    return row["require_cuda"] if row and ENGINES[key].get("nvidia_require_cuda", True) else None


def admits(key: str, gpu_name: str, data_center: bool, driver: str) -> bool:
    """Whether the toolkit starts the image (an image without a requirement always starts)."""
    text = base_string(key)
    if text is None:
        assert ENGINES[key].get("nvidia_require_cuda") is False, f"{key}: no string and no 'none'"
        return True
    native = compat.branch_cuda(driver, compat.driver_branches())
    ok, _ = compat.require_cuda_satisfied(text, driver=driver, cuda=native, cc=None,
                                          brands=compat.card_brands(gpu_name, data_center))
    assert ok is not None, (key, gpu_name, driver)
    return ok


# -- the catalog ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("key", GPU_IMAGES)
def test_every_catalog_gpu_image_has_a_base_with_a_source(key):
    row = BASES["images"].get(key)
    assert row is not None, f"{key}: no row in catalog/cuda_bases.yaml images"
    assert row["confidence"] in ("H", "M", "U") and row["source"].strip()
    assert "../shared" not in row["source"]
    m = re.search(r"nvidia/cuda:(\d+\.\d+\.\d+)-", row["base_image"] or "")
    if m is None:  # not an nvidia/cuda base: the image sets no requirement, and says so
        assert ENGINES[key].get("nvidia_require_cuda") is False, key
        return
    # the base is the image's CUDA (engines.yaml), and its string is in the table, or explicitly unknown
    assert m.group(1) == str(ENGINES[key]["cuda"]), (key, row["base_image"])
    base = BASES["bases"].get(m.group(1))
    assert base is not None, f"{key}: base {m.group(1)} has no NVIDIA_REQUIRE_CUDA row"
    assert base["confidence"] in ("H", "M", "U") and base["source"].strip() and "../shared" not in base["source"]


@pytest.mark.parametrize("version", sorted(BASES["bases"]))
def test_each_base_string_asks_its_own_cuda_and_parses(version):
    text = BASES["bases"][version]["require_cuda"]
    major_minor = ".".join(version.split(".")[:2])
    assert text.split()[0] == f"cuda>={major_minor}"
    for alt in text.split()[1:]:
        assert re.fullmatch(r"brand=[a-z]+,driver>=\d+,driver<\d+", alt), alt


def test_the_repos_own_dockerfiles_name_the_bases_the_catalog_gives():
    for folder in ("llamacpp-cuda", "vllm-volta"):
        meta = yaml.safe_load((ROOT / "dockerfiles" / folder / "image.yaml").read_text(encoding="utf-8"))
        assert BASES["images"][meta["catalog_key"]]["base_image"] == meta["bases"]["RUNTIME_DIGEST"]["image"]


def test_the_loaded_catalog_carries_the_strings_and_says_where_they_came_from():
    cat = compat.load_engine_catalog()
    for key in GPU_IMAGES:
        rel = cat.release(key)
        assert rel is not None
        want = base_string(key)
        assert rel.require_cuda == want, key
        assert rel.require_cuda_source == ("catalog" if want else None), key
        assert rel.base_image == BASES["images"][key]["base_image"]


# -- the toolkit's verdict: brand x driver branch x image (from the catalog's strings) -----------------------

DRIVERS = ["470.256.02", "535.183.01", "550.144.03", "570.133.07", "575.57.08", "580.95.05"]
CARDS = {"geforce": ("NVIDIA GeForce RTX 3090", False), "tesla": ("Tesla T4", True),
         "quadro": ("Quadro RTX 8000", False)}
# per image, per brand: admitted (T) or refused (F) on R470, R535, R550, R570, R575, R580. Read off the
# bases: 12.2 lists every brand (geforce too) on R470 and R525; 12.6 lists all but GeForce on R470/535/550;
# 12.8 on R470/535/550/560/565; 12.9 on R535-R570; 13.0 on R535/550/565/570/575; natively, cuda>= admits.
TABLE = {
    "llamacpp:b5000-cu122": {"geforce": "TTTTTT", "tesla": "TTTTTT", "quadro": "TTTTTT"},
    "vllm:0.19.1-volta": {"geforce": "FFFTTT", "tesla": "TTTTTT", "quadro": "TTTTTT"},
    "llamacpp:server-cuda-12.8": {"geforce": "FFFTTT", "tesla": "TTTTTT", "quadro": "TTTTTT"},
    "vllm:0.10.1.1": {"geforce": "FFFTTT", "tesla": "TTTTTT", "quadro": "TTTTTT"},
    "vllm:0.19.1": {"geforce": "FFFFTT", "tesla": "FTTTTT", "quadro": "FTTTTT"},
    "vllm:0.26.0": {"geforce": "FFFFFT", "tesla": "FTTTTT", "quadro": "FTTTTT"},
    "llamacpp:vendored-0.3.36-cu118": {"geforce": "TTTTTT", "tesla": "TTTTTT", "quadro": "TTTTTT"},
}


@pytest.mark.parametrize(("key", "brand", "driver", "want"), [
    (key, brand, driver, row[i] == "T")
    for key, brands in TABLE.items() for brand, row in brands.items() for i, driver in enumerate(DRIVERS)])
def test_the_toolkit_admits_or_refuses_as_the_bases_say(key, brand, driver, want):
    name, dc = CARDS[brand]
    assert admits(key, name, dc, driver) is want


@pytest.mark.parametrize("driver", ["535.183.01", "550.144.03"])
def test_check_cuda_driver_refuses_a_geforce_the_toolkit_refuses_naming_the_catalog_as_the_source(driver):
    cat = compat.load_engine_catalog()
    v = compat.check_cuda_driver(cat.release("llamacpp:server-cuda-12.8"), cat, driver=driver, cuda_driver=None,
                                 gpu_name="NVIDIA GeForce RTX 3090", cc="8.6", data_center=False,
                                 toolkit_version=None, runtimes=[])
    assert v.status == "fail", v
    assert "the NVIDIA container toolkit refuses to start llamacpp:server-cuda-12.8" in v.message
    assert "catalog cuda_bases.yaml" in v.message and "nvidia/cuda:12.8.1-runtime-ubuntu24.04" in v.message
    assert "NVIDIA_DISABLE_REQUIRE=1" in v.fix and ">= 570.124.06" in v.fix


def test_an_unconfirmed_string_only_warns():
    cat = compat.load_engine_catalog()
    rel = cat.release("llamacpp:server-cuda-12.8").model_copy(update={"require_cuda_confidence": "U"})
    v = compat.check_cuda_driver(rel, cat, driver="550.144.03", cuda_driver=None, gpu_name="NVIDIA GeForce RTX 3090",
                                 cc="8.6", data_center=False, toolkit_version=None, runtimes=[])
    assert v.status == "warn", v
    assert "unconfirmed" in v.message and "NVIDIA_DISABLE_REQUIRE=1" in v.message


# -- precedence: inspected > images.lock > catalog ---------------------------------------------------------


@pytest.mark.parametrize(("archs_source", "said"), [
    ("inspected", "inspected from the image"),
    ("lock", "(images.lock)"),
    (None, "catalog cuda_bases.yaml"),
])
def test_the_string_read_from_the_image_wins_over_the_catalog(archs_source, said):
    cat = compat.load_engine_catalog()
    image_ref = SimpleNamespace(key="vllm:0.10.1.1", archs_source=archs_source, cuda=None, archs=(), torch_archs=(),
                                require_cuda="cuda>=12.8" if archs_source else None)
    rel, _ = preflight.release_for(image_ref, cat)
    v = compat.check_cuda_driver(rel, cat, driver="550.144.03", cuda_driver=None, gpu_name="NVIDIA A100-SXM4-80GB",
                                 cc="8.0", data_center=True, toolkit_version=None, runtimes=[])
    # the bare cuda>=12.8 read from the image has no exception: the A100 on R550 is refused by it, while the
    # base's string lists tesla on R550 and admits it
    assert v.status == ("fail" if archs_source else "warn"), v
    if archs_source:
        assert said in v.message, v.message
    else:
        assert rel.require_cuda_source == "catalog" and rel.require_cuda == base_string("vllm:0.10.1.1")


# -- the planner --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("driver", ["535.183.01", "570.133.07"])
@pytest.mark.parametrize(("engine", "quant"), [("vllm", "bf16"), ("llamacpp", "q4_k_m")])
def test_the_default_image_on_a_geforce_is_one_the_toolkit_admits(driver, engine, quant):
    gpu = find_gpu("rtx-3090")
    p = plan(PlanRequest(model="qwen2.5-7b-instruct", quant=quant, gpu="rtx-3090", engine=engine, driver=driver,
                         context=4096))
    if p.fits:
        assert admits(p.image, gpu.name, bool(gpu.data_center), driver), p.image
        return
    # none of the engine's images starts there: refused, naming the toolkit and both fixes
    assert all(not admits(k, gpu.name, bool(gpu.data_center), driver) for k in GPU_IMAGES
               if ENGINES[k]["engine"] == engine and compat.kernel_coverage(compat.load_engine_catalog().release(k),
                                                                             gpu.compute_capability))
    text = " ".join(p.notes)
    assert "REFUSED: no catalog vllm image" in text and "the NVIDIA container toolkit refuses" in text
    assert "NVIDIA_DISABLE_REQUIRE=1" in text and "upgrade the driver" in text
    assert "runs on this driver today: llamacpp:b5000-cu122" in text


def test_a_plan_for_an_image_the_toolkit_refuses_is_refused_with_its_reason():
    p = plan(PlanRequest(model="qwen2.5-7b-instruct", quant="bf16", gpu="rtx-4090", engine="vllm",
                         driver="570.133.07", image="vllm:0.26.0", context=4096))
    assert not p.fits
    text = " ".join(p.notes)
    assert "REFUSED: image vllm:0.26.0 does not run on this host: the NVIDIA container toolkit refuses" in text
    assert "asks cuda>=13.0" in text and "brand geforce/geforcertx" in text and "on R570" in text
    assert "NVIDIA_DISABLE_REQUIRE=1" in text
