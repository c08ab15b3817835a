"""The offload step (``knowledge/planner/offload.py``): a plan whose weights do not all fit the GPUs is
refused, unless --offload accepts it; then it says how many layers stay and how slow the rest makes it."""

from __future__ import annotations

import pytest

from tests.planner_stages import stages

Q32 = "qwen2.5-32b-instruct"


@pytest.mark.parametrize(
    ("kw", "fits", "verdict"),
    [
        (dict(model="qwen2.5-7b-instruct", quant="q4_k_m", gpu="t4"), True, None),  # resident
        (dict(model=Q32, quant="q8_0", gpu="rtx-4090"), False, "REFUSED: the weights (34.0 GB on the GPU) do not fit"),
        (dict(model=Q32, quant="q8_0", gpu="rtx-4090", offload=True), True, "OFFLOAD: 35% of the weights"),
        (dict(model=Q32, quant="gptq-int8", gpu="rtx-4090", offload=True), True, "OFFLOAD: 44% of the weights"),
        (dict(model=Q32, quant="q8_0", gpu="rtx-4090", offload=True, context=200000), False, "nothing fits"),
    ],
)
def test_the_offload_verdict(kw, fits, verdict):
    o = stages(**{"context": 4096, **kw}).offload
    assert o.fits is fits
    said = o.problems + o.notes
    if verdict is None:
        assert said == ()
    else:
        assert len(said) == 1 and verdict in said[0], said


@pytest.mark.parametrize(
    ("kw", "where"),
    [
        (dict(model=Q32, quant="q8_0", gpu="rtx-4090"), "host memory"),  # llama.cpp runs the layers on the CPU
        (dict(model=Q32, quant="gptq-int8", gpu="rtx-4090"), "host memory over PCIe"),  # vLLM streams them
    ],
)
def test_an_accepted_offload_keeps_fewer_layers_and_is_slower_than_resident(kw, where):
    s = stages(context=4096, offload=True, **kw)
    o, sp = s.offload, s.speed
    assert 0 < o.gpu_layers < s.r.spec.num_layers
    assert 0 < o.offload_bytes < s.budget.basis_weights_bytes
    assert o.realistic[1] < sp.resident.low  # offloaded, even the best case is below the resident worst case
    assert o.realistic[0] <= o.realistic[1] <= o.ceiling
    assert where in o.notes[0]
    # an offloaded plan holds exactly what was asked
    assert (o.max_context, o.max_concurrency) == (4096, 1)


def test_a_refused_plan_names_the_way_out():
    o = stages(model=Q32, quant="q8_0", gpu="rtx-4090", context=4096).offload
    assert "smaller quant, a shorter context or more GPUs, or pass --offload" in o.problems[0]


def test_a_resident_plan_is_passed_through():
    s = stages(model="qwen2.5-7b-instruct", quant="q4_k_m", gpu="t4", context=4096)
    o, f, sp = s.offload, s.fit, s.speed
    assert (o.gpu_layers, o.offload_bytes, o.fits) == (s.r.spec.num_layers, 0.0, f.context_fits)
    assert (o.ceiling, o.realistic) == (sp.ceiling, (sp.resident.low, sp.resident.high))
    assert (o.max_context, o.max_concurrency) == (f.max_context, f.max_concurrency)
