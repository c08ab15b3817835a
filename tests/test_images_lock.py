"""The committed images.lock agrees with the engine-release catalog (both directions), and says
honestly which digests were confirmed by a registry."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmfleet.images.lock import (
    PACKAGED_LOCK,
    catalog_archs,
    default_lock_path,
    load_lock,
    parse_lock,
    render_lock,
)
from llmfleet.knowledge.compat import load_engine_catalog
from llmfleet.knowledge.preflight import parse_archs

REPO = Path(__file__).resolve().parents[1]
CATALOG = load_engine_catalog()
SHIPPED = REPO / "src" / "llmfleet" / "images" / "images.lock"
LOCK = load_lock(SHIPPED)
GPU_KEYS = {k for k, r in CATALOG.images.items() if not r.cpu}


def test_the_default_lock_is_the_project_one_else_the_shipped_one(tmp_path, monkeypatch):
    assert Path(str(PACKAGED_LOCK)) == SHIPPED
    monkeypatch.chdir(tmp_path)
    assert default_lock_path() == SHIPPED  # a folder without its own images.lock
    (tmp_path / "images.lock").write_text("version: 1\nimages: {}\n")
    assert default_lock_path() == Path("images.lock")
    assert load_lock(None).images == {}


def test_every_gpu_image_in_the_catalog_is_in_the_lock():
    missing = GPU_KEYS - set(LOCK.images)
    assert not missing, f"catalog/engines.yaml images not in images.lock: {sorted(missing)}; run images.pin"


def test_every_locked_image_has_a_catalog_entry():
    extra = set(LOCK.images) - set(CATALOG.images)
    assert not extra, f"images.lock entries without a catalog entry (preflight cannot judge them): {sorted(extra)}"


def test_lab_images_are_not_in_the_fleet_lock():
    cpu = set(LOCK.images) & {k for k, r in CATALOG.images.items() if r.repository.startswith("lab/")}
    assert not cpu, f"lab (CPU) images belong in .lab/images.lock, not images.lock: {sorted(cpu)}"


@pytest.mark.parametrize("key", sorted(LOCK.images))
def test_lock_entry_matches_its_catalog_entry(key):
    e, rel = LOCK.images[key], CATALOG.images[key]
    assert (e.repository, e.tag, e.cuda) == (rel.repository, rel.tag, rel.cuda)
    assert e.archs == catalog_archs(rel)
    # preflight reads the lock's archs; they must mean the catalog's kernels
    k = parse_archs(e.archs)
    assert k is not None and sorted(k.sass) == sorted(rel.kernels.sass) and sorted(k.ptx) == sorted(rel.kernels.ptx)


@pytest.mark.parametrize("key", sorted(LOCK.images))
def test_a_digest_says_where_it_came_from(key):
    """No digest without provenance: confirmed by a registry (verified) or a named source."""
    e = LOCK.images[key]
    if e.digest is not None:
        assert e.verified or e.digest_source, f"{key}: digest with neither verified nor digest_source"
    else:
        assert e.verified is None, f"{key}: verified without a digest"


def test_the_file_is_in_the_form_images_pin_writes():
    text = SHIPPED.read_text()
    assert render_lock(parse_lock(text)) == text, "images.lock was edited by hand into another layout"


def test_the_lab_lock_names_only_catalog_images():
    path = REPO / ".lab" / "images.lock"
    if not path.exists():
        pytest.skip("no .lab/images.lock (written by `invoke lab.setup`)")
    lab = load_lock(path)
    unknown = set(lab.images) - set(CATALOG.images)
    assert not unknown, f".lab/images.lock entries without a catalog entry: {sorted(unknown)}"


@pytest.mark.parametrize("key", sorted(LOCK.images))
def test_lock_torch_build_matches_the_catalog(key):
    """A vLLM image runs on a card only if its PyTorch build covers it too (vllm#19185): the lock
    carries the catalog's torch facts unless images.inspect read them from the image."""
    e, rel = LOCK.images[key], CATALOG.images[key]
    if e.archs_source == "inspected":
        pytest.skip(f"{key}: facts read from the image")
    assert e.archs_source == "catalog"
    if rel.torch is None:
        assert (e.torch, e.torch_archs) == (None, ())
    else:
        assert (e.torch, e.torch_cuda, list(e.torch_archs)) == (rel.torch.version, rel.torch.cuda, rel.torch.archs)
