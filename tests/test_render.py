"""Rendering a release: compose parsed back as YAML, the unit, secrets, flag merging, hostile values."""

from __future__ import annotations

import configparser
import json
import re
import shutil
import subprocess

import pytest
import yaml

from llmfleet.errors import UsageError
from llmfleet.images.lock import ImageLock, LockedImage, resolve
from llmfleet.inventory.services import host_settings
from llmfleet.knowledge.planner import PlanSummary
from llmfleet.release.render import load_role, mask_env, merge_engine_args, render, split_flags

DIGEST = "sha256:" + "ab" * 32
LOCK = ImageLock(images={
    "vllm:0.9.2": LockedImage("vllm:0.9.2", "docker.io/vllm/vllm-openai", DIGEST, "v0.9.2", "12.8", ("7.0",)),
    "llamacpp:b5000-cu122": LockedImage(
        "llamacpp:b5000-cu122", "ghcr.io/ggml-org/llama.cpp", DIGEST, "server-cuda-b5000", "12.2", ("6.1",)
    ),
})
SECRET = "sk-test-Zq81!x$HOME"


def _settings(**svc):
    base = {
        "name": "chat",
        "engine": "vllm",
        "model": "qwen2.5-7b",
        "model_path": "/srv/models/qwen",
        "image": "vllm:0.9.2",
    }
    base.update(svc)
    return host_settings("gpu-01", {"llmfleet_services": [base]})


def _render(plan=None, api_key=None, **svc):
    hs = _settings(**svc)
    s = hs.services[0]
    img = resolve(s.image, LOCK, mirrors=hs.image_mirrors)
    return render(s, hs, img, plan, api_key=api_key)


def _compose(r):
    return yaml.safe_load(r.files["compose.yml"])["services"]["engine"]


def _unescape(v: str) -> str:
    return v.replace("$$", "$")


@pytest.mark.parametrize(
    ("engine", "image", "model_path", "gpus", "expect_ipc", "expect_devices"),
    [
        # one GPU: a private /dev/shm instead of the host's IPC namespace; several: ipc host
        ("vllm", "vllm:0.9.2", "/srv/models/qwen", [0], None, {"device_ids": ["0"]}),
        ("vllm", "vllm:0.9.2", "/srv/models/qwen", [2, 3], "host", {"device_ids": ["2", "3"]}),
        ("llamacpp", "llamacpp:b5000-cu122", "/srv/models/q.gguf", "all", None, {"count": "all"}),
        ("llamacpp", "llamacpp:b5000-cu122", "/srv/models/q.gguf", [1], None, {"device_ids": ["1"]}),
    ],
)
def test_compose_shape(engine, image, model_path, gpus, expect_ipc, expect_devices):
    r = _render(engine=engine, image=image, model_path=model_path, gpus=gpus, port=8123)
    doc = yaml.safe_load(r.files["compose.yml"])
    assert doc["name"] == "llmfleet-chat"
    c = doc["services"]["engine"]
    assert c["image"].endswith("@" + DIGEST)
    assert c["restart"] == "no"
    assert c["env_file"] == ["service.env"]
    # the engine keeps its own port inside the container (vLLM 8000, llama.cpp 8080); only the
    # published port is the service's
    engine_port = {"vllm": 8000, "llamacpp": 8080}[engine]
    assert c["ports"] == [{"target": engine_port, "published": "8123", "host_ip": "0.0.0.0", "protocol": "tcp"}]
    vol = c["volumes"][0]
    assert vol["source"] == model_path and vol["read_only"] is True and vol["type"] == "bind"
    assert c.get("ipc") == expect_ipc
    (dev,) = c["deploy"]["resources"]["reservations"]["devices"]
    assert dev["driver"] == "nvidia" and dev["capabilities"] == ["gpu"]
    for k, v in expect_devices.items():
        assert dev[k] == v
    role = load_role(engine)
    assert vol["target"] == role.model_target
    cmd = c["command"]
    assert cmd[cmd.index("--port") + 1] == str(engine_port)
    assert cmd[cmd.index("--host") + 1] == "0.0.0.0"
    assert role.model_target in cmd


def test_mirror_keeps_digest():
    hs = host_settings("h", {
        "llmfleet_services": [{"name": "a", "engine": "vllm", "model": "m", "model_path": "/m", "image": "vllm:0.9.2"}],
        "llmfleet_image_mirrors": {"docker.io/vllm": "mirror.corp:5000/hub/vllm"},
    })
    s = hs.services[0]
    r = render(s, hs, resolve(s.image, LOCK, mirrors=hs.image_mirrors))
    assert _compose(r)["image"] == f"mirror.corp:5000/hub/vllm/vllm-openai@{DIGEST}"


@pytest.mark.parametrize(
    ("engine", "plan", "override", "expected"),
    [
        # the override replaces the plan's value of the same flag, under any of its names
        ("vllm", ["--max-model-len", "4096", "--dtype", "float16"], ["--max-model-len=8192"],
         ["--max-model-len", "8192", "--dtype", "float16"]),
        ("vllm", ["--max-model-len", "4096"], ["--enforce-eager"], ["--max-model-len", "4096", "--enforce-eager"]),
        ("vllm", ["-tp", "2"], ["--tensor-parallel-size", "4"], ["--tensor-parallel-size", "4"]),
        ("vllm", ["--quantization", "gptq"], ["-q", "awq"], ["-q", "awq"]),
        ("llamacpp", ["-ngl", "99", "-c", "4096", "-np", "1"], ["--ctx-size", "8192"],
         ["-ngl", "99", "--ctx-size", "8192", "-np", "1"]),
        ("llamacpp", ["-ngl", "99"], ["--n-gpu-layers", "20"], ["--n-gpu-layers", "20"]),
        # a known switch takes no value; an unknown flag keeps its values
        ("llamacpp", [], ["--mlock", "--fancy", "a", "b"], ["--mlock", "--fancy", "a", "b"]),
        ("llamacpp", ["-ngl", "-1"], [], ["-ngl", "-1"]),
        ("vllm", [], [], []),
    ],
)
def test_merge_engine_args(engine, plan, override, expected):
    assert merge_engine_args(plan, override, load_role(engine)) == expected


@pytest.mark.parametrize(
    ("engine", "override"),
    [("vllm", ["--port", "9"]), ("vllm", ["--model=/x"]), ("vllm", ["--api-key", "k"]),
     ("llamacpp", ["-m", "/x.gguf"]), ("llamacpp", ["--alias", "x"]), ("llamacpp", ["--api-key-file", "/k"])],
)
def test_managed_flags_cannot_be_overridden(engine, override):
    with pytest.raises(UsageError, match="set by llmfleet"):
        merge_engine_args([], override, load_role(engine))


def test_positional_value_is_refused():
    with pytest.raises(UsageError, match="not a flag"):
        split_flags(["oops", "--dtype", "half"], load_role("vllm"))


def test_plan_flags_then_overrides_reach_the_command():
    plan = PlanSummary(engine_args=("--max-model-len", "4096", "--gpu-memory-utilization", "0.9"))
    r = _render(plan=plan, engine_args=["--gpu-memory-utilization", "0.95"])
    cmd = _compose(r)["command"]
    assert cmd[cmd.index("--gpu-memory-utilization") + 1] == "0.95"
    assert cmd.count("--gpu-memory-utilization") == 1
    assert cmd[cmd.index("--max-model-len") + 1] == "4096"
    assert PlanSummary.from_dict(r.plan) == plan  # the manifest holds the plan as data, read back the same


def test_secrets_only_in_env_file():
    hs = host_settings("h", {"llmfleet_services": [{
        "name": "chat", "engine": "llamacpp", "model": "m", "model_path": "/m.gguf",
        "image": "llamacpp:b5000-cu122", "api_key": {"from_env": "CHAT_KEY"},
    }]})
    s = hs.services[0]
    r = render(s, hs, resolve(s.image, LOCK), api_key=SECRET)
    env = r.files["service.env"]
    assert f"LLAMA_API_KEY='{SECRET}'" in env
    assert r.modes["service.env"] == 0o600
    for name, text in r.files.items():
        if name != "service.env":
            assert SECRET not in text
    masked = r.masked_files()
    assert all(SECRET not in t for t in masked.values())
    assert "LLAMA_API_KEY='********'" in masked["service.env"]
    assert SECRET not in json.dumps(r.inputs) and "CHAT_KEY" in json.dumps(r.inputs)
    assert "--api-key" not in _compose(r)["command"]


def test_api_key_configured_but_unresolved_is_an_error():
    hs = host_settings("h", {"llmfleet_services": [{
        "name": "c", "engine": "vllm", "model": "m", "model_path": "/m", "image": "vllm:0.9.2",
        "api_key": {"from_env": "K"},
    }]})
    s = hs.services[0]
    with pytest.raises(UsageError, match="not resolved"):
        render(s, hs, resolve(s.image, LOCK))


@pytest.mark.parametrize("bad", ["it's", "a\nb", ""])
def test_api_key_that_cannot_be_written_safely_is_refused(bad):
    hs = host_settings("h", {"llmfleet_services": [{
        "name": "c", "engine": "vllm", "model": "m", "model_path": "/m", "image": "vllm:0.9.2",
        "api_key": {"from_env": "K"},
    }]})
    s = hs.services[0]
    with pytest.raises(UsageError) as exc:
        render(s, hs, resolve(s.image, LOCK), api_key=bad)
    assert bad not in str(exc.value) or bad == ""


HOSTILE = [
    ("model_path", "/srv/models/$(touch /tmp/pwned)"),
    ("model_path", "/srv/models/a b;rm -rf /;`id`"),
    ("served_name", "x\"; touch /tmp/pwned; echo \""),
    ("served_name", "${HOME}"),
    ("env", {"SAFE_VAR": "$(touch /tmp/pwned) ${PATH} '\" \\"}),
]


@pytest.mark.parametrize(("field", "value"), HOSTILE)
def test_hostile_values_stay_literal(field, value):
    r = _render(**{field: value})
    c = _compose(r)
    text = r.files["compose.yml"]
    # every "$" reaches compose doubled, so interpolation gives back the literal value
    assert not re.search(r"(?<!\$)\$(?!\$)", text.replace("$$", "")), text
    if field == "model_path":
        assert _unescape(c["volumes"][0]["source"]) == value
    elif field == "served_name":
        cmd = c["command"]
        assert _unescape(cmd[cmd.index("--served-model-name") + 1]) == value
    else:
        env = {k: _unescape(v) for k, v in c["environment"].items()}
        assert {k: env[k] for k in value} == value


@pytest.mark.skipif(shutil.which("docker") is None, reason="docker CLI with compose v2 not installed")
def test_compose_itself_reads_hostile_values_literally(tmp_path):
    proc = subprocess.run(["docker", "compose", "version"], capture_output=True, text=True, timeout=20)
    if proc.returncode != 0:
        pytest.skip("docker compose v2 not available")
    value = "/srv/models/$(touch /tmp/pwned) ${HOME} $$x"
    r = _render(model_path=value, served_name="n$(id)", env={"OPT": "${PATH}"}, gpus=[0])
    for name, text in r.files.items():
        (tmp_path / name).write_text(text)
    out = subprocess.run(
        ["docker", "compose", "-f", str(tmp_path / "compose.yml"), "config", "--format", "json"],
        capture_output=True, text=True, timeout=30, cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    svc = json.loads(out.stdout)["services"]["engine"]
    # `compose config` prints its model re-escaped (each literal dollar doubled again): the values
    # arrived literally, with nothing substituted.
    assert svc["volumes"][0]["source"] == value.replace("$", "$$")
    assert "n$$(id)" in svc["command"]
    assert svc["environment"]["OPT"] == "$${PATH}"
    assert "ipc" not in svc and int(svc["shm_size"]) == 8 * 1024**3  # one GPU: a private /dev/shm
    assert svc["restart"] == "no"
    assert svc["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"] == ["0"]


def test_unit_file():
    r = _render(health={"load_timeout_s": 1800})
    cp = configparser.ConfigParser(strict=False, interpolation=None)
    cp.optionxform = str  # type: ignore[assignment]
    cp.read_string(r.files["llmfleet-chat.service"])
    u, s = cp["Unit"], cp["Service"]
    assert "docker.service" in u["After"] and u["Requires"] == "docker.service"
    assert int(u["StartLimitBurst"]) >= 2 and int(u["StartLimitIntervalSec"]) >= 600
    assert s["Restart"] == "on-failure"
    assert int(s["TimeoutStartSec"]) >= 1800
    assert s["StandardOutput"] == "journal"
    assert s["WorkingDirectory"] == "/opt/llmfleet/services/chat/current"
    compose = "/usr/bin/docker compose -p llmfleet-chat -f compose.yml"
    # in the foreground (systemd owns the lifecycle); a leftover of a crashed run is replaced
    assert s["ExecStart"] == (f"{compose} up --no-color --no-log-prefix --abort-on-container-exit "
                              "--force-recreate --remove-orphans")
    # the run before's stopped container goes before the start (a running one is left to up)
    assert s["ExecStartPre"] == "-/bin/sh -c '/usr/bin/docker rm llmfleet-chat >/dev/null 2>&1 || true'"
    # the stop stops the container (its grace period) and keeps it and the project's network
    assert s["ExecStop"] == "-/bin/sh -c '/usr/bin/docker stop llmfleet-chat >/dev/null'"
    assert int(s["TimeoutStopSec"]) == 90
    assert cp["Install"]["WantedBy"] == "multi-user.target"


@pytest.mark.parametrize(("value", "seconds"), [
    ("30s", 30.0), ("1m30s", 90.0), ("1.5h", 5400.0), ("500ms", 0.5), (45, 45.0), (2.5, 2.5),
    ("", None), ("30", None), ("abc", None), ("30s junk", None), (True, None), (None, None),
])
def test_duration_s(value, seconds):
    from llmfleet.release.render import duration_s

    assert duration_s(value) == seconds


@pytest.mark.parametrize(("overrides", "timeout"), [
    ({}, 90),  # the templates' 30 s grace period
    ({"stop_grace_period": "10s"}, 90),  # never below the default
    ({"stop_grace_period": "2m"}, 180),  # the same 60 s margin over a longer grace period
    ({"stop_grace_period": "100.2s"}, 161),
    ({"stop_grace_period": "soon"}, 90),  # not a duration: compose config -q refuses it before a switch
])
def test_unit_stop_timeout_covers_the_grace_period(overrides, timeout):
    r = _render(compose_overrides=overrides) if overrides else _render()
    cp = configparser.ConfigParser(strict=False, interpolation=None)
    cp.optionxform = str  # type: ignore[assignment]
    cp.read_string(r.files["llmfleet-chat.service"])
    assert int(cp["Service"]["TimeoutStopSec"]) == timeout


def test_content_hash_tracks_every_input():
    base = _render(api_key=None)
    assert _render().content_hash == base.content_hash
    assert _render(engine_args=["--enforce-eager"]).content_hash != base.content_hash
    assert _render(port=9000).content_hash != base.content_hash
    hs = host_settings("h", {"llmfleet_services": [{
        "name": "chat", "engine": "vllm", "model": "qwen2.5-7b", "model_path": "/srv/models/qwen",
        "image": "vllm:0.9.2", "api_key": {"from_env": "K"}}]})
    s = hs.services[0]
    k1 = render(s, hs, resolve(s.image, LOCK), api_key="one").content_hash
    k2 = render(s, hs, resolve(s.image, LOCK), api_key="two").content_hash
    assert k1 != k2  # a rotated key is a change on the host


def test_mask_env_masks_every_assignment():
    assert mask_env("# c\nA='x'\nB='y'\n") == "# c\nA='********'\nB='********'\n"


# ---------------------------------------------------------------------------------------------
# Where roles and templates come from: inventory, then configuration, then the package


def _role_copy(dest, engine="vllm", marker="# site role\n"):
    from llmfleet.release.render import PACKAGE_ROLES

    (dest / engine / "templates").mkdir(parents=True)
    src = PACKAGE_ROLES / engine
    (dest / engine / "defaults.yml").write_text(src.joinpath("defaults.yml").read_text())
    tpl = src.joinpath("templates", "compose.yml.j2").read_text()
    (dest / engine / "templates" / "compose.yml.j2").write_text(marker + tpl)


def test_search_paths_order_inventory_then_configuration(tmp_path):
    from llmfleet.release.render import search_paths

    inv = tmp_path / "inv"
    inv.mkdir()
    got = search_paths({"llmfleet_roles_path": "../site-roles", "llmfleet_templates_path": ["/abs/t"]}, str(inv),
                       {"roles_path": "/etc/llmfleet/roles", "templates_path": None})
    assert got == {"roles_dir": [str(inv / "../site-roles"), "/etc/llmfleet/roles"], "templates_dir": ["/abs/t"]}
    # an inventory file: relative to its folder
    assert search_paths({"llmfleet_roles_path": "r"}, str(inv / "hosts.yml"), None)["roles_dir"] == [str(inv / "r")]
    assert search_paths({}, str(inv), {}) == {"roles_dir": [], "templates_dir": []}


def test_the_first_folder_with_the_role_wins_and_others_fall_through(tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    _role_copy(first, "vllm", "# first\n")
    _role_copy(second, "vllm", "# second\n")
    _role_copy(second, "llamacpp", "# second llamacpp\n")
    hs = _settings()
    s = hs.services[0]
    img = resolve(s.image, LOCK, mirrors=hs.image_mirrors)
    r = render(s, hs, img, roles_dir=[str(first), str(second)])
    assert r.files["compose.yml"].startswith("# first\n")
    hs = _settings(engine="llamacpp", image="llamacpp:b5000-cu122", model_path="/srv/models/q.gguf")
    s = hs.services[0]
    r = render(s, hs, resolve(s.image, LOCK), roles_dir=[str(first), str(second)])
    assert r.files["compose.yml"].startswith("# second llamacpp\n")  # first has no llamacpp role
    packaged = _render(engine="llamacpp", image="llamacpp:b5000-cu122", model_path="/srv/models/q.gguf")
    assert not packaged.files["compose.yml"].startswith("# second")


def test_a_template_override_replaces_only_that_file(tmp_path):
    from llmfleet.release.render import PACKAGE_TEMPLATES

    (tmp_path / "service.env.j2").write_text("# site env\n" + PACKAGE_TEMPLATES.joinpath("service.env.j2").read_text())
    hs = _settings()
    s = hs.services[0]
    r = render(s, hs, resolve(s.image, LOCK), templates_dir=str(tmp_path))
    assert r.files["service.env"].startswith("# site env\n")
    assert r.files["llmfleet-chat.service"] == _render().files["llmfleet-chat.service"]


def test_an_unknown_engine_names_where_it_looked_and_what_is_there(tmp_path):
    from llmfleet.release.render import load_role

    with pytest.raises(UsageError) as err:
        load_role("tgi", [str(tmp_path)])
    msg = str(err.value)
    assert "no role for engine 'tgi'" in msg and str(tmp_path) in msg and "roles there: dcgm-exporter, gateway, llamacpp, node-exporter, vllm" in msg
    # the packaged roles load: an installed llmfleet never says "no role for vllm; known: vllm"
    assert load_role("vllm").engine == "vllm" and load_role("llamacpp").engine == "llamacpp"


# The container around the engine: healthcheck on the engine's port, bounded logs, hardening,
# caches, bind address, compose_overrides.


@pytest.mark.parametrize(("engine", "image", "model_path", "port"), [
    # vLLM serves on 8000 by default (`vllm serve --port`); the vllm-openai image has no HEALTHCHECK
    ("vllm", "vllm:0.9.2", "/srv/models/qwen", 8000),
    # ggml-org/llama.cpp .devops/cuda.Dockerfile (server stage): HEALTHCHECK curl -f localhost:8080/health
    ("llamacpp", "llamacpp:b5000-cu122", "/srv/models/q.gguf", 8080),
])
def test_healthcheck_probes_the_port_the_engine_listens_on(engine, image, model_path, port):
    r = _render(engine=engine, image=image, model_path=model_path, port=9001,
                health={"load_timeout_s": 1200})
    c = _compose(r)
    test = c["healthcheck"]["test"]
    assert test[0] == "CMD"
    assert any(f"127.0.0.1:{port}/health" in t for t in test)
    cmd = c["command"]
    assert cmd[cmd.index("--port") + 1] == str(port) == str(c["ports"][0]["target"])
    # no verdict while the model loads: the start period is the service's load budget
    assert c["healthcheck"]["start_period"] == "1200s"
    assert c["healthcheck"]["retries"] >= 2


@pytest.mark.parametrize("engine", ["vllm", "llamacpp"])
def test_hardening_and_bounded_logs(engine):
    image = {"vllm": "vllm:0.9.2", "llamacpp": "llamacpp:b5000-cu122"}[engine]
    c = _compose(_render(engine=engine, image=image, gpus=[0]))
    assert c["security_opt"] == ["no-new-privileges:true"]
    assert c["cap_drop"] == ["ALL"]
    assert "privileged" not in c and "cap_add" not in c
    assert c["logging"]["driver"] == "json-file"
    size = c["logging"]["options"]["max-size"]
    assert re.fullmatch(r"\d+m", size) and int(size[:-1]) <= 100
    assert 1 <= int(c["logging"]["options"]["max-file"]) <= 10


def test_vllm_limits_cache_and_shared_memory():
    r = _render(engine="vllm", gpus=[0])
    doc = yaml.safe_load(r.files["compose.yml"])
    c = doc["services"]["engine"]
    # NVIDIA's recommended limits for PyTorch containers: memlock unlimited, 64 MiB stack
    assert c["ulimits"] == {"memlock": -1, "stack": 67108864}
    assert "ipc" not in c and c["shm_size"] == "8gb"
    cache = [v for v in c["volumes"] if v["type"] == "volume"]
    assert cache == [{"type": "volume", "source": "engine-cache", "target": "/var/cache/llmfleet-engine"}]
    assert doc["volumes"]["engine-cache"]["name"] == "llmfleet-chat-cache"
    env = c["environment"]
    assert env["VLLM_CACHE_ROOT"].startswith("/var/cache/llmfleet-engine/")
    assert env["TRITON_CACHE_DIR"].startswith("/var/cache/llmfleet-engine/")
    assert "user" not in c  # the image writes its caches under root's home


def test_llamacpp_runs_as_nobody_without_cache_volume():
    c = _compose(_render(engine="llamacpp", image="llamacpp:b5000-cu122", model_path="/srv/q.gguf"))
    assert c["user"] == "65534:65534"
    assert [v["type"] for v in c["volumes"]] == ["bind"]
    assert "ulimits" not in c


def test_service_env_wins_over_cache_defaults():
    c = _compose(_render(engine="vllm", env={"TRITON_CACHE_DIR": "/tmp/t"}))
    assert c["environment"]["TRITON_CACHE_DIR"] == "/tmp/t"


@pytest.mark.parametrize(("host_bind", "svc_bind", "expected"), [
    (None, None, "0.0.0.0"),
    ("10.0.0.5", None, "10.0.0.5"),
    ("10.0.0.5", "127.0.0.1", "127.0.0.1"),
    (None, "::1", "::1"),
])
def test_bind_address_from_host_or_service(host_bind, svc_bind, expected):
    svc = {"name": "chat", "engine": "vllm", "model": "m", "model_path": "/m", "image": "vllm:0.9.2"}
    if svc_bind:
        svc["bind_address"] = svc_bind
    hv = {"llmfleet_services": [svc]}
    if host_bind:
        hv["llmfleet_bind_address"] = host_bind
    hs = host_settings("h", hv)
    r = render(hs.services[0], hs, resolve("vllm:0.9.2", LOCK))
    assert _compose(r)["ports"][0]["host_ip"] == expected
    assert f"{expected}" in r.files["watchdog.sh"] or expected in {"0.0.0.0"}


@pytest.mark.parametrize("bad", ["0.0.0.0; rm -rf /", "localhost", "10.0.0.256", "$(id)", "10.0.0.1\n"])
def test_bind_address_must_be_an_ip(bad):
    from llmfleet.errors import InventoryError

    with pytest.raises(InventoryError, match="bind_address"):
        _settings(bind_address=bad)


def test_compose_overrides_become_a_second_file_named_by_the_unit():
    r = _render(compose_overrides={"environment": {"X": "a$b"}, "mem_limit": "64g"})
    over = yaml.safe_load(r.files["compose.override.yml"])
    assert over == {"services": {"engine": {"environment": {"X": "a$$b"}, "mem_limit": "64g"}}}
    unit = r.files["llmfleet-chat.service"]
    compose = "/usr/bin/docker compose -p llmfleet-chat -f compose.yml -f compose.override.yml"
    assert unit.count("-f compose.yml -f compose.override.yml") == 1  # up: the only compose run
    assert f"ExecStart={compose} up " in unit
    plain = _render()
    assert "compose.override.yml" not in plain.files
    assert "compose.override.yml" not in plain.files["llmfleet-chat.service"]
    assert r.content_hash != plain.content_hash


@pytest.mark.parametrize(("overrides", "msg"), [
    ({"image": "evil:latest"}, "image is set by llmfleet"),
    ({"command": ["sh"]}, "command is set by llmfleet"),
    ({"ports": ["0.0.0.0:1:1"]}, "ports is set by llmfleet"),
    ({"env_file": ["/etc/shadow"]}, "env_file is set by llmfleet"),
    ({"bad key!": 1}, "is not a compose key"),
    ({"environment": {"A": "x" * 20000}}, "keep it under"),
])
def test_compose_overrides_cannot_take_llmfleets_keys(overrides, msg):
    from llmfleet.errors import InventoryError

    with pytest.raises(InventoryError, match=msg):
        _settings(compose_overrides=overrides)


@pytest.mark.skipif(shutil.which("docker") is None, reason="needs the docker CLI (compose plugin)")
@pytest.mark.parametrize("engine", ["vllm", "llamacpp"])
def test_docker_compose_config_accepts_the_rendered_files(tmp_path, engine):
    """`docker compose config` (no daemon needed) accepts every key rendered, merged with overrides."""
    image = {"vllm": "vllm:0.9.2", "llamacpp": "llamacpp:b5000-cu122"}[engine]
    r = _render(engine=engine, image=image, gpus=[0], compose_overrides={"mem_limit": "64g",
                                                                   "healthcheck": {"interval": "10s"}})
    for name, text in r.files.items():
        (tmp_path / name).write_text(text)
    proc = subprocess.run(["docker", "compose", "-p", "t", "-f", "compose.yml", "-f", "compose.override.yml",
                           "config", "--format", "json"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    if "is not a docker command" in proc.stderr:
        pytest.skip("no compose plugin")
    assert proc.returncode == 0, proc.stderr
    c = json.loads(proc.stdout)["services"]["engine"]
    assert c["healthcheck"]["interval"] == "10s" and c["healthcheck"]["test"][0] == "CMD"
    assert c["cap_drop"] == ["ALL"] and c["security_opt"] == ["no-new-privileges:true"]
    assert c["logging"]["options"]["max-file"] == "5"


def test_compiled_templates_are_kept_in_a_private_cache_and_used_only_from_there(tmp_path, monkeypatch):
    from llmfleet import cache
    from llmfleet.release import render as R
    from llmfleet.release import template_cache

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    folder = cache.cache_dir(template_cache.CACHE)
    text = "{{ name | q }} on {{ port }}\n"
    env = R._env()
    template_cache.code_for(env, text)
    (kept,) = folder.iterdir()
    assert kept.stat().st_mode & 0o777 == 0o600 and folder.stat().st_mode & 0o777 == 0o700
    # the kept code renders exactly as the template compiled from its text
    tpl = env.template_class.from_code(env, template_cache.code_for(env, text), env.make_globals(None))
    assert tpl.render(name="a'b $x", port=8000) == env.from_string(text).render(name="a'b $x", port=8000)
    template_cache.code_for(env, text + "#")
    assert len(list(folder.iterdir())) == 2  # another text, another entry
    # what is kept is what runs; but from a folder others can write to, nothing is read (nor written)
    import marshal

    def rendered() -> str:
        return env.template_class.from_code(env, template_cache.code_for(env, text), env.make_globals(None)).render(name="n", port=1)

    planted = marshal.dumps(env.compile("planted\n"))
    kept.write_bytes(planted)
    assert rendered() == "planted\n"
    folder.chmod(0o777)
    assert rendered() == '"n" on 1\n'
    assert kept.read_bytes() == planted


@pytest.mark.parametrize(
    ("engine_args", "env_value"),
    [
        ([], "sk-abc123"),
        (["-lv", "3"], "sk-abc123"),
        (["-lv", "4"], "sk-abc123,sk-abc123"),  # llama-server would log "****c123" for a single key
        (["--verbosity=5"], "sk-abc123,sk-abc123"),
    ],
)
def test_a_verbose_llama_server_gets_the_key_listed_twice_so_no_fragment_reaches_its_log(engine_args, env_value):
    hs = _settings(engine="llamacpp", image="llamacpp:b5000-cu122", model_path="/m.gguf",
                   api_key={"from_env": "X"}, engine_args=engine_args)
    s = hs.services[0]
    r = render(s, hs, resolve(s.image, LOCK), api_key="sk-abc123")
    assert f"LLAMA_API_KEY='{env_value}'\n" in r.files["service.env"]
    assert "abc123" not in r.files["compose.yml"]


@pytest.mark.parametrize(
    ("image", "gpu", "ptx_only"),
    [
        # llamacpp:server-cuda-12.8 (CMAKE_CUDA_ARCHITECTURES 50-virtual 61-virtual 70-virtual 75-virtual
        # 80-virtual 86-real 89-real 90-virtual 120a-real): PTX only on a P40, V100, T4 or A100
        ("llamacpp:server-cuda-12.8", "p40", True),
        ("llamacpp:server-cuda-12.8", "v100-sxm2-32gb", True),
        ("llamacpp:server-cuda-12.8", "rtx-4090", False),
        ("llamacpp:b5000-cu122", "p40", False),
    ],
)
def test_a_ptx_only_card_gets_a_cuda_jit_cache_volume(image, gpu, ptx_only):
    """The driver JIT-compiles PTX at every container start unless its cache (CUDA_CACHE_PATH, default
    ~/.nv/ComputeCache) survives: a named volume and CUDA_CACHE_PATH/CUDA_CACHE_MAXSIZE where the
    planned card has only PTX in the image, nothing otherwise."""
    lock = ImageLock(images={image: LockedImage(image, "ghcr.io/ggml-org/llama.cpp", DIGEST, "server-cuda")})
    hs = _settings(engine="llamacpp", image=image, model_path="/srv/models/q.gguf", gpus=[0])
    s = hs.services[0]
    r = render(s, hs, resolve(s.image, lock), PlanSummary(engine="llamacpp", gpu=gpu))
    doc = yaml.safe_load(r.files["compose.yml"])
    c = doc["services"]["engine"]
    volumes = [v for v in c["volumes"] if v["type"] == "volume"]
    env = c.get("environment") or {}
    if ptx_only:
        assert volumes == [{"type": "volume", "source": "engine-cache", "target": "/tmp"}]
        assert doc["volumes"]["engine-cache"]["name"] == "llmfleet-chat-cache"
        assert env["CUDA_CACHE_PATH"] == "/tmp/cuda-jit" and env["CUDA_CACHE_MAXSIZE"] == "4294967296"
    else:
        assert volumes == [] and "CUDA_CACHE_PATH" not in env and "volumes" not in doc


def test_vllm_keeps_its_compile_cache_and_adds_the_jit_cache_only_where_ptx_runs():
    from llmfleet.release.render import container_settings, load_role

    role = load_role("vllm", None)
    s = _settings(gpus=[0]).services[0]
    plain = container_settings(role, s)
    jit = container_settings(role, s, jit_cache=True)
    assert "CUDA_CACHE_PATH" not in plain["environment"]
    assert jit["cache_volume"] == plain["cache_volume"] and jit["cache_target"] == "/var/cache/llmfleet-engine"
    assert jit["environment"]["CUDA_CACHE_PATH"] == "/var/cache/llmfleet-engine/cuda-jit"
    assert jit["environment"]["TRITON_CACHE_DIR"] == plain["environment"]["TRITON_CACHE_DIR"]
