"""Careless commands: tasks (rows for tests/test_careless_commands.py; tests/careless.py says what each asserts)."""

from tests.careless import Cmd

ROWS: list[Cmd] = [
    # no vLLM image runs on a P40 (compute capability 6.1): refused, naming vLLM's floor and llama.cpp
    Cmd(("plan", "--engine", "vllm", "--gpu", "p40", "--model", "qwen2.5-7b"), 1, says="--engine llamacpp"),
    Cmd(("plan", "--engine", "vllm", "--gpu", "p40", "--model", "qwen2.5-7b", "--json"), 1,
        says="compute capability 7.0 or higher", json=True),
]
ROWS += [
    # a card by family or prefix: every variant it names, never a neighbour by spelling
    Cmd(("plan", "--gpu", "v100", "--model", "qwen2.5-7b"), 2, says="'v100-pcie-16gb'"),
    Cmd(("plan", "--gpu", "a100", "--model", "qwen2.5-7b"), 2, says="'a100-sxm4-80gb'"),
    Cmd(("plan", "--gpu", "Tesla V100", "--model", "qwen2.5-7b"), 2, says="'v100-sxm2-32gb'"),
    Cmd(("plan", "--gpu", "h200", "--model", "qwen2.5-7b"), 2, says="'h200-nvl-141gb'"),
    Cmd(("plan", "--gpu", "H100", "--model", "qwen2.5-7b"), 2, says="'h100-sxm-80gb'"),
]
