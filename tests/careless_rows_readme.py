"""Careless commands: readme (rows for tests/test_careless_commands.py; tests/careless.py says what each asserts).

README's "Install with pip" commands as written, in the harness's folder: its inventory only, no images.lock
(the packaged lock applies, where the example's images have no digest), no registry reachable.
"""

from tests.careless import SILENT, Cmd

# a registry that cannot be reached, whatever this machine's network: every request goes to a closed proxy
NO_REGISTRY = {"HTTPS_PROXY": "http://127.0.0.1:9", "https_proxy": "http://127.0.0.1:9",
               "HTTP_PROXY": "http://127.0.0.1:9", "http_proxy": "http://127.0.0.1:9", "ALL_PROXY": "",
               "all_proxy": "", "NO_PROXY": "", "no_proxy": ""}
KEY = {"QWEN32B_API_KEY": "k"}  # the example service's API key, set as the README's reader would

ROWS: list[Cmd] = [
    # offline checks of the inventory: unpinned images are warnings, not errors
    Cmd(("inventory", "--check"), 0, says="not pinned to a digest yet"),
    # render connects nowhere and needs no pin: the unpinned image is rendered with its tag, and marked
    Cmd(("render", "--host", SILENT), 0, says=f"# {SILENT}/qwen32b: UNPINNED image llmfleet/vllm-openai:v0.19.1-volta-cu126"),
    Cmd(("render", "--host", SILENT, "--service", "qwen32b"), 0, says="`llmfleet images.pin vllm=0.19.1-volta`",
        env=KEY),
    Cmd(("render", "--host", SILENT, "--json"), 0, says="'vllm:0.19.1-volta' is UNPINNED", json=True),
    Cmd(("render", "--host", SILENT, "--allow-unpinned"), 0, says="UNPINNED image"),  # older scripts' flag
    # pinning needs the image's registry: without it, one line and no images.lock left behind
    Cmd(("images.pin", "vllm=0.19.1"), 1, says="registry-1.docker.io: cannot reach registry", env=NO_REGISTRY),
    # deploy still refuses an unpinned image, before connecting, naming both ways out
    Cmd(("deploy", "--host", SILENT), 2, says="images.pin vllm=0.19.1-volta` where the registry is reachable, "
                                             "or pass --allow-unpinned", env=KEY),
    Cmd(("deploy", "--host", SILENT, "--json"), 2, says="--allow-unpinned", env=KEY, json=True),
]
