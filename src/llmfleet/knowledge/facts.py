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


class CardHealth(BaseModel):
    """What ``nvidia-smi -q`` says about one card's hardware (None: the driver did not print it, or "N/A")."""

    bus_id: str  # as nvidia-smi prints it, "00000000:3B:00.0"
    index: int | None = None  # the card's nvidia-smi index, matched by bus id
    name: str | None = None
    ecc_mode: str | None = None  # "Enabled" / "Disabled"
    ecc_volatile_uncorrectable: int | None = None  # since the last driver load or GPU reset
    ecc_aggregate_uncorrectable: int | None = None  # over the card's life (its inforom)
    sram_threshold_exceeded: bool | None = None  # the aggregate SRAM uncorrectable count passed NVIDIA's limit
    retired_pages_sbe: int | None = None
    retired_pages_dbe: int | None = None
    retired_pages_pending: bool | None = None  # a page waits for a reset to be retired
    remapped_rows_uncorrectable: int | None = None
    remap_pending: bool | None = None  # a row remap waits for a GPU reset
    remap_failure: bool | None = None  # a row remap has failed on this card
    repair_pending: list[str] = Field(default_factory=list)  # "Channel Repair Pending", "TPC Repair Pending"
    unrepairable_memory: bool | None = None
    recovery_action: str | None = None  # "GPU Recovery Action" (R570 and newer): None, Reset, Reboot, Drain...
    idle: bool | None = None  # the "Idle" clocks event/throttle reason is active
    throttle_active: list[str] = Field(default_factory=list)  # active clocks event reasons other than Idle
    pcie_gen_current: int | None = None
    pcie_gen_max: int | None = None  # the highest this card reaches in this host ("Max")
    pcie_gen_host_max: int | None = None  # the slot's ("Host Max", newer drivers)
    pcie_width_current: int | None = None  # lanes: 16 for "16x"
    pcie_width_max: int | None = None


class XidEvent(BaseModel):
    """Xid lines of one code for one card in the kernel log since boot (as far as it was read)."""

    code: int
    pci: str  # "0000:3b:00", as the kernel line names the card (lowercase)
    count: int = 1
    last: str = ""  # the last such line, bounded
    gpu_index: int | None = None  # the nvidia-smi index of that card, when it is listed


class MissingCard(BaseModel):
    """An NVIDIA display or 3D device on the PCI bus that nvidia-smi does not list (or says it lost)."""

    pci: str  # "0000:3b:00.0"
    device: str | None = None  # "10de:2335"
    expected_index: int | None = None  # its place among the bus's NVIDIA cards (nvidia-smi's order)
    why: str = ""


class GpuHealth(BaseModel):
    """The cards' hardware health, read in the probe's round trip (``llmfleet.host.gpu_health``)."""

    cards: list[CardHealth] = Field(default_factory=list)
    xids: list[XidEvent] = Field(default_factory=list)
    xid_source: Literal["dmesg", "journalctl"] | None = None  # None: the kernel log was not readable
    xid_lines: int = 0  # Xid lines seen since boot
    pci_source: Literal["lspci", "sysfs"] | None = None
    pci_gpus: list[str] = Field(default_factory=list)  # NVIDIA display/3D devices on the PCI bus
    missing: list[MissingCard] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)  # what could not be read, one line each


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
    # the cards' hardware health: nvidia-smi -q, the kernel log's Xid lines, the PCI bus; None: not read
    gpu_health: GpuHealth | None = None
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
