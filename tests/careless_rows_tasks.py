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

# every --json task prints one JSON document whatever the outcome: a host that refuses, bad input
_BENCH_INV = (b"all:\n  vars: {ansible_user: deploy, ansible_ssh_private_key_file: ~/.ssh/fleet_ed25519}\n"
              b"  hosts:\n    gpu-4090-01:\n      ansible_host: 127.0.0.1\n      ansible_port: 1\n"
              b"      llmfleet_gpu: NVIDIA GeForce RTX 4090\n      llmfleet_services:\n"
              b"        - {name: gemma27b, engine: llamacpp, model: gemma-3-27b-it, quant: q4_k_m,\n"
              b"           model_path: /srv/models/g.gguf, image: 'llamacpp:b5000-cu122', port: 8080}\n")
ROWS += [
    Cmd(("bench", "--host", "gpu-4090-01", "--json"), 2, says="api_key", json=True),
    Cmd(("bench", "--host", "gpu-4090-01", "--json", "-i", "bench-inv/hosts.yml"), 1, says="connection refused",
        json=True, connects=True, files={"bench-inv/hosts.yml": _BENCH_INV}),
    Cmd(("bench", "--json"), 2, says="--host", json=True),
    Cmd(("lock.release", "--host", "gpu-4090-01", "--json", "--yes"), 1, says="connection refused", json=True,
        connects=True),
    Cmd(("lock.release", "--host", "gpu-4090-01", "--json"), 1, says="connection refused", json=True, connects=True),
    Cmd(("lock.release", "--host", "nosuchhost", "--json", "--yes"), 2, json=True),
    Cmd(("lock.status", "--host", "gpu-4090-01", "--json"), 1, json=True, connects=True, one_line=False),
    Cmd(("status", "--host", "gpu-4090-01", "--json"), 1, says="unreachable", json=True, connects=True),
    Cmd(("facts", "--host", "gpu-4090-01", "--json"), 1, json=True, connects=True, one_line=False),
    Cmd(("preflight", "--host", "gpu-4090-01", "--json"), 1, json=True, connects=True, one_line=False),
    Cmd(("releases", "--host", "gpu-4090-01", "--json"), 1, says="unreachable", json=True, connects=True),
    Cmd(("audit", "--host", "gpu-4090-01", "--json"), 1, says="unreachable", json=True, connects=True),
    Cmd(("speed", "--host", "gpu-4090-01", "--json"), 1, says="unreachable", json=True, connects=True),
    Cmd(("facts", "--json"), 2, says="--host", json=True),
    Cmd(("plan", "--gpu", "p40", "--model", "nosuchmodel", "--json"), 2, says="unknown model", json=True),
    Cmd(("bundle.verify", "no-such-folder", "--json"), 2, says="no such folder", json=True),
]

# images.verify with no registry answering: the count of pinned images and the cause (a loopback registry
# port where nothing listens: no connection leaves the machine)
_LOOP_LOCK = (b"images:\n  vllm:0.10.1.1:\n    repository: 127.0.0.1:1/vllm/vllm-openai\n    tag: v0.10.1.1\n"
              b"    digest: sha256:d731ee65c044ae0977421eed3d93f931d4b7d79614394184c939db35b8f28fc2\n"
              b"  vllm:0.19.1:\n    repository: docker.io/vllm/vllm-openai\n    tag: v0.19.1\n    digest: null\n")
ROWS += [
    Cmd(("images.verify", "--lock", "loop.lock"), 1, says="1 of 1 pinned image could not be checked: registry unreachable",
        files={"loop.lock": _LOOP_LOCK}),
    Cmd(("images.verify", "--lock", "loop.lock", "--json"), 1, says="registry unreachable", json=True,
        files={"loop.lock": _LOOP_LOCK}),
]

ROWS += [
    # hints name the command as typed: `llmfleet speed`, never `invoke speed`
    Cmd(("speed",), 0, says="`llmfleet speed --group G`"),
    # bundle.create takes pinned images only: its refusal does not suggest --allow-unpinned, which it refuses
    Cmd(("bundle.create", "bundle-out", "--host", "gpu-4090-01"), 2, says="`llmfleet images.pin llamacpp=b5000-cu122`"),
    # a lock named by --lock that is not there: one line, exit 2
    Cmd(("images.list", "--lock", "MISSING"), 2, says="MISSING: no such lock file"),
    Cmd(("images.list", "--lock", "MISSING", "--json"), 2, says="no such lock file", json=True),
]
