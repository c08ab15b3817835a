"""Careless commands: tasks (rows for tests/test_careless_commands.py; tests/careless.py says what each asserts)."""

from tests.careless import Cmd

ROWS: list[Cmd] = [
    # no vLLM image runs on a P40 (compute capability 6.1): refused, naming vLLM's floor and llama.cpp
    Cmd(("plan", "--engine", "vllm", "--gpu", "p40", "--model", "qwen2.5-7b"), 1, says="--engine llamacpp"),
    Cmd(("plan", "--engine", "vllm", "--gpu", "p40", "--model", "qwen2.5-7b", "--json"), 1,
        says="compute capability 7.0 or higher", json=True),
]
