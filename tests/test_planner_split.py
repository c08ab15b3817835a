"""A split over cards and hosts (``knowledge/planner/split.py``): what each card holds by the engine's
own rules, the card that binds the KV pool, and what the split costs per token."""

from __future__ import annotations

import pytest

from tests.planner_stages import stages

L70 = "llama-3.1-70b-instruct"


@pytest.mark.parametrize(
    ("kw", "cards", "hosts_of_cards"),
    [
        (dict(model=L70, quant="gptq-int4", gpu="v100-sxm2-32gb", gpus=4), 4, [0, 0, 0, 0]),
        (dict(model=L70, quant="gptq-int4", gpu="v100-sxm2-32gb", gpus=2, hosts=2), 4, [0, 0, 1, 1]),
        (dict(model=L70, quant="q4_k_m", gpu="p40", gpus=2), 2, [0, 0]),
        # llama.cpp's device order: the workers' RPC devices first, then the head's cards
        (dict(model=L70, quant="q4_k_m", gpu="p40", gpus=2, hosts=2), 4, [1, 1, 0, 0]),
        (dict(model=L70, quant="q4_k_m", gpu="p40", gpus=4, split_mode="row"), 4, [0, 0, 0, 0]),
        (dict(model="qwen2.5-7b-instruct", quant="q4_k_m", gpu="t4"), 0, []),  # one card: no split
    ],
)
def test_each_card_holds_its_share(kw, cards, hosts_of_cards):
    s = stages(context=8192, **kw)
    devices, w = s.fit.devices, s.r.weights
    assert len(devices) == cards
    assert [d.host for d in devices] == hosts_of_cards
    if not devices:
        return
    loaded = w.loaded_bytes(s.r.engine)
    if s.budget.tensor:  # each rank holds 1/gpus of its stage
        assert sum(d.weights_bytes for d in devices) == pytest.approx(loaded, rel=0.01)
    else:  # layer and row splits hold every weight once over all cards
        assert sum(d.weights_bytes for d in devices) == pytest.approx(loaded, rel=1e-6)
    if s.budget.split_mode == "layer":
        assert sum(d.layers for d in devices) == s.r.spec.num_layers
        assert sum(d.kv_share for d in devices) == pytest.approx(1.0)
    # the tightest card sets the KV pool: the least room per share of the KV cache
    rooms = [(s.budget.card_bytes - d.weights_bytes - d.fixed_bytes) / d.kv_share for d in devices if d.kv_share]
    assert s.fit.pool_bytes == pytest.approx(min(rooms))
    assert devices[s.fit.binding].kv_share > 0


@pytest.mark.parametrize(
    ("kw", "how"),
    [
        (dict(model=L70, quant="gptq-int4", gpu="v100-sxm2-32gb", gpus=4), "all-reduce"),
        (dict(model=L70, quant="gptq-int4", gpu="rtx-3090", gpus=2, interconnect="nvlink"), "nvlink"),
        (dict(model=L70, quant="gptq-int4", gpu="v100-sxm2-32gb", gpus=2, hosts=2, network_gbps=25.0), "25"),
        (dict(model=L70, quant="q4_k_m", gpu="p40", gpus=2, hosts=2), "RPC"),
    ],
)
def test_a_split_costs_time_per_token_and_says_how(kw, how):
    comm = stages(context=8192, **kw).speed.comm
    assert 0 < comm.low_us <= comm.high_us
    assert how.lower() in comm.text.lower(), comm.text


def test_a_slower_network_costs_more():
    base = dict(model=L70, quant="gptq-int4", gpu="v100-sxm2-32gb", gpus=2, hosts=2, context=8192)
    fast = stages(**base, network_gbps=100.0).speed.comm
    slow = stages(**base, network_gbps=10.0).speed.comm
    assert slow.high_us > fast.high_us


def test_nvlink_all_reduces_cost_less_than_pcie():
    base = dict(model=L70, quant="gptq-int4", gpu="rtx-3090", gpus=2, context=8192)
    nvlink = stages(**base, interconnect="nvlink").speed.comm
    pcie = stages(**base, interconnect="pcie").speed.comm
    assert nvlink.high_us < pcie.high_us
