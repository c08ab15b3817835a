"""What a host has: its GPUs, driver, Docker, container toolkit, disks, model files, listening ports and
releases, as the host probe (``llmfleet.host.probe``) reports them. The model only: the probe's parser
(``llmfleet.host.facts``) fills it, the preflight checks (``llmfleet.knowledge.preflight``) and the
planner judge it, ``invoke facts --json`` prints it and ``--facts FILE`` reads it back.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from llmfleet.knowledge.release_state import ServiceState


class GpuFact(BaseModel):
    """A card as the host reports it (the GPU catalog's entry is ``knowledge.catalog.Gpu``)."""

    index: int
    name: str
    uuid: str | None = None
    pci_bus_id: str | None = None
    memory_total_mib: int | None = None
    memory_used_mib: int | None = None
    memory_free_mib: int | None = None
    compute_capability: str | None = None
    compute_capability_source: Literal["driver", "catalog"] | None = None
    catalog_id: str | None = None
    data_center: bool | None = None


class Docker(BaseModel):
    client_version: str | None = None
    server_version: str | None = None
    runtimes: list[str] = Field(default_factory=list)
    default_runtime: str | None = None
    root_dir: str | None = None
    cdi_spec_dirs: list[str] = Field(default_factory=list)
    compose_plugin: str | None = None  # the compose CLI plugin's version, as `docker info` lists it
    error: str | None = None


class Container(BaseModel):
    name: str
    image: str = ""
    state: str = ""
    ports: list[int] = Field(default_factory=list)
    labels: dict[str, str] = Field(default_factory=dict)


class Toolkit(BaseModel):
    """The NVIDIA container toolkit as seen on the host."""

    version: str | None = None  # nvidia-ctk --version
    cli_version: str | None = None  # nvidia-container-cli --version (libnvidia-container)
    runtime_path: str | None = None  # nvidia-container-runtime
    hook_path: str | None = None  # nvidia-container-runtime-hook (enables `docker --gpus`)
    cdi_specs: list[str] = Field(default_factory=list)
    cdi_kinds: list[str] = Field(default_factory=list)


class Compose(BaseModel):
    v2: str | None = None  # `docker compose version --short`
    v1: str | None = None  # `docker-compose version --short`


class Disk(BaseModel):
    label: str
    path: str
    mount: str | None = None
    total_mib: int | None = None
    free_mib: int | None = None


class ModelFile(BaseModel):
    path: str
    kind: Literal["dir", "file", "other", "missing", "unknown"] = "unknown"
    readable: bool | None = None
    size_bytes: int | None = None
    entries: list[str] = Field(default_factory=list)  # folder: file names (capped)
    magic: str | None = None  # file: first bytes, alphanumerics only ("GGUF")
    # The llmfleet manifest beside the model (``invoke models.push``; llmfleet.models): read at all,
    # its text (None: there is none), and every file's [size, mtime] now, to compare with it.
    manifest_read: bool = False
    manifest: str | None = None
    observed: dict[str, list[int]] = Field(default_factory=dict)


class Facts(BaseModel):
    host: str
    probe_version: int | None = None
    gpus: list[GpuFact] = Field(default_factory=list)
    nvidia_smi: str | None = None  # path, None when missing
    driver_version: str | None = None
    driver_loaded: bool | None = None
    # "open" / "proprietary" from /proc/driver/nvidia/version ("Open Kernel Module" or not); None: unread
    driver_kernel_modules: Literal["open", "proprietary"] | None = None
    cuda_driver_version: str | None = None  # highest CUDA the driver supports, "12.8"
    cuda_driver_source: Literal["banner", "driver-branch"] | None = None
    # `nvidia-smi topo -m` as the host printed it (terminal escapes removed): the GPU-to-GPU link matrix
    # preflight's topology check reads; None when nvidia-smi is missing or the command failed (see errors)
    gpu_topology: str | None = None
    host_cuda_compat: list[str] = Field(default_factory=list)
    docker: Docker = Field(default_factory=Docker)
    containers: list[Container] = Field(default_factory=list)
    images: list[str] = Field(default_factory=list)  # repo:tag and repo@digest present locally
    toolkit: Toolkit = Field(default_factory=Toolkit)
    compose: Compose = Field(default_factory=Compose)
    disks: list[Disk] = Field(default_factory=list)
    ram_total_mib: int | None = None
    ram_available_mib: int | None = None
    kernel: str | None = None
    machine: str | None = None
    systemd: bool | None = None
    root: str | None = None
    releases: dict[str, ServiceState] = Field(default_factory=dict)  # the release state reader's model
    releases_read: bool = False  # the release state reader ran to its end: ``releases`` is the whole state
    ports: list[int] = Field(default_factory=list)  # listening TCP ports
    models: list[ModelFile] = Field(default_factory=list)
    errors: list[str] = Field(default_factory=list)
    # each section's wall time on the host ("df docker_root": 0.02), from probe v3 on
    probe_seconds: dict[str, float] = Field(default_factory=dict)

    def disk(self, label: str) -> Disk | None:
        return next((d for d in self.disks if d.label == label), None)

    def model(self, path: str) -> ModelFile | None:
        return next((m for m in self.models if m.path == path), None)
