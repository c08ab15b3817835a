#!/bin/sh
# llmfleet host probe: everything preflight needs, gathered in one SSH round trip.
#
# Usage (the script arrives on stdin):  sh -s -- MARK ROOT [MODEL_PATH ...]
#   MARK        a random token chosen by the caller; it frames every section, so no command
#               output (however hostile) can fake a section boundary
#   ROOT        llmfleet's root on the host (/opt/llmfleet)
#   MODEL_PATH  model files or folders the planned services mount
#
# Output: one document of sections
#   ==MARK== begin NAME [ARG]
#   <raw output of one command, capped, stderr merged>
#   ==MARK== end NAME rc=N t=SECONDS
# A newline is always printed before the end line; the parser removes it. A section whose body is
# longer than its cap was cut. t= is the section's wall time from /proc/uptime (absent without it).
# Every command is bounded by a timeout and reads /dev/null, never this script. A missing tool
# gives its section rc=127; nothing aborts the probe.
#
# The slow parts (nvidia-smi, the GPU health, the Docker CLI, the release state, model files) run at once, each
# group into a file of its own under a private temporary folder; their sections are printed after
# the quick ones, so the probe takes as long as its slowest group, not the sum. Without a temporary
# folder everything runs one after the other. Docker is asked once for `docker info` (its JSON has
# the root folder and the compose plugin's version); `docker compose version` and `docker-compose
# version` (v1) only when it does not.
#
# POSIX sh only (dash, busybox ash, bash): no arrays, no pipefail, no local.

PROBE_VERSION=4

probe_main() {
    MARK=${1:-llmfleet-probe}
    ROOT=${2:-/opt/llmfleet}
    if [ "$#" -ge 2 ]; then shift 2; else shift "$#"; fi
    SMALLCAP=65536
    CAP=$SMALLCAP
    FN=no
    BIGCAP=262144
    STATECAP=1048576
    GROUP=main
    GROUPS_STARTED=""
    PATH=$PATH:/usr/sbin:/sbin:/usr/bin:/bin:/usr/local/bin:/usr/local/sbin
    export PATH
    LC_ALL=C
    export LC_ALL
    # Low priority: the probe never competes with the engine it checks for the host's CPU (the
    # commands it starts inherit it). Without renice it runs as it is.
    renice -n 10 -p $$ >/dev/null 2>&1 || :

    TMPD=$(mktemp -d 2>/dev/null) || TMPD=""
    if [ -z "$TMPD" ]; then
        TMPD=${TMPDIR:-/tmp}/llmfleet-probe.$$
        mkdir -m 700 "$TMPD" 2>/dev/null || TMPD=""
    fi
    trap 'if [ -n "$TMPD" ]; then rm -rf "$TMPD"; fi' EXIT
    trap 'exit 130' INT TERM HUP

    if command -v timeout >/dev/null 2>&1; then HAVE_TIMEOUT=yes; else HAVE_TIMEOUT=no; fi
    if command -v head >/dev/null 2>&1; then HAVE_HEAD=yes; else HAVE_HEAD=no; fi
    if [ -r /proc/uptime ]; then HAVE_UPTIME=yes; else HAVE_UPTIME=no; fi

    fsection meta "" 5 meta_info
    fsection tools "" 5 tool_paths

    # The slow groups, at once (each waits for nothing but itself).
    if command -v nvidia-smi >/dev/null 2>&1; then
        group gpu_query gpu_query_part
        group gpu_banner section nvidia_smi "" 20 nvidia-smi
        # how the GPUs are linked (NVLink, PCIe switch, host bridge, across the CPUs): preflight's topology
        group gpu_topo section nvidia_topo "" 20 nvidia-smi topo -m
    fi
    # the cards' hardware health: nvidia-smi -q, the kernel log's Xid lines, the NVIDIA devices on the
    # PCI bus (llmfleet_gpu_xids and llmfleet_gpu_pci: the GPU health reader, sent before this script)
    group gpu_health gpu_health_part
    if command -v docker >/dev/null 2>&1; then
        group docker docker_part
        group docker_ps section docker_ps "" 15 docker ps --no-trunc --format '{{json .}}'
        group docker_images section docker_images "" 15 docker image ls --no-trunc --format '{{json .}}'
    fi
    group toolkit toolkit_part
    # llmfleet releases: every service's current release, unit and kept releases with their
    # manifests; llmfleet_release_state is the release store's own reader, sent before this script.
    if command -v llmfleet_release_state >/dev/null 2>&1; then
        group release_state release_state_part
    fi
    if [ "$#" -gt 0 ]; then
        group models models_part "$@"
    fi

    # The quick ones, meanwhile.
    if [ -r /proc/driver/nvidia/version ]; then
        section proc_driver "" 5 cat /proc/driver/nvidia/version
    fi
    fsection cuda_compat "" 5 list_cuda_compat
    fsection cdi "" 5 list_cdi
    section meminfo "" 5 cat /proc/meminfo
    fsection df root 10 df_for "$ROOT"
    if command -v ss >/dev/null 2>&1; then
        section ss "" 10 ss -ltnH
    else
        fsection proc_net_tcp "" 5 cat_proc_net_tcp
    fi

    collect
    printf '==%s== done\n' "$MARK"
}

# group NAME CMD...: CMD (sections) in the background into $TMPD/g.NAME; in the foreground
# without a temporary folder. collect waits for every group and prints their files in order.
group() {
    g_name=$1
    shift
    if [ -z "$TMPD" ]; then
        "$@"
        return 0
    fi
    ( GROUP=$g_name; "$@" ) >"$TMPD/g.$g_name" 2>&1 </dev/null &
    GROUPS_STARTED="$GROUPS_STARTED $g_name:$!"
}

collect() {
    for g in $GROUPS_STARTED; do
        wait "${g#*:}"
    done
    for g in $GROUPS_STARTED; do
        cat "$TMPD/g.${g%%:*}" 2>/dev/null
    done
}

# GPUs and driver. The query with compute_cap fails on R470 drivers ("Field "compute_cap" is not a
# valid field to query."); then ask again without it.
gpu_query_part() {
    section nvidia_query "" 20 nvidia-smi \
        --query-gpu=index,name,uuid,pci.bus_id,memory.total,memory.used,memory.free,driver_version,compute_cap \
        --format=csv,noheader,nounits
    if [ "$LAST_RC" != 0 ]; then
        section nvidia_query_nocc "" 20 nvidia-smi \
            --query-gpu=index,name,uuid,pci.bus_id,memory.total,memory.used,memory.free,driver_version \
            --format=csv,noheader,nounits
    fi
}

# GPU hardware health: `nvidia-smi -q` (ECC, retired pages, row remaps, clocks event reasons, PCIe
# link; about 14 KiB a card), then the reader's kernel log and PCI sections.
gpu_health_part() {
    if command -v nvidia-smi >/dev/null 2>&1; then
        CAP=$STATECAP
        section nvidia_q "" 20 nvidia-smi -q
        CAP=$SMALLCAP
    fi
    if command -v llmfleet_gpu_xids >/dev/null 2>&1; then
        fsection kernel_xid "" 10 llmfleet_gpu_xids
        fsection pci_gpus "" 10 llmfleet_gpu_pci
    fi
}

# Container engine: `docker info` once; its JSON names the engine's root folder (for df) and the
# compose plugin (else `docker compose version`).
docker_part() {
    CAP=$BIGCAP
    section docker_info "" 20 docker info --format '{{json .}}'
    CAP=$SMALLCAP
    DOCKER_ROOT=/var/lib/docker
    if [ -n "$TMPD" ]; then
        d=$(sed -n 's/.*"DockerRootDir":"\([^"]*\)".*/\1/p' "$TMPD/g.$GROUP" 2>/dev/null | head -n 1)
        if grep -q '"Name":"compose"' "$TMPD/g.$GROUP" 2>/dev/null; then COMPOSE_SEEN=yes; else COMPOSE_SEEN=no; fi
    else
        d=$(run_bounded 10 docker info --format '{{.DockerRootDir}}' </dev/null 2>/dev/null)
        COMPOSE_SEEN=no
    fi
    case "$d" in /*) DOCKER_ROOT=$d ;; esac
    fsection df docker_root 10 df_for "$DOCKER_ROOT"
    if [ "$COMPOSE_SEEN" != yes ]; then
        section compose_v2 "" 10 docker compose version --short
        # v1 matters only without the v2 plugin
        if command -v docker-compose >/dev/null 2>&1; then
            section compose_v1 "" 10 docker-compose version --short
        fi
    fi
}

# The NVIDIA container toolkit.
toolkit_part() {
    if command -v nvidia-ctk >/dev/null 2>&1; then
        section nvidia_ctk "" 10 nvidia-ctk --version
    fi
    if command -v nvidia-container-cli >/dev/null 2>&1; then
        section nvidia_container_cli "" 10 nvidia-container-cli --version
    fi
}

release_state_part() {
    CAP=$STATECAP
    fsection release_state "" 10 llmfleet_release_state "$ROOT"
    CAP=$SMALLCAP
}

# Model files the planned services need.
models_part() {
    i=0
    for p in "$@"; do
        fsection model "$i" 15 show_model "$p"
        # the llmfleet manifest beside it and its files' size and mtime (llmfleet.models.scripts)
        if command -v llmfleet_model_manifest >/dev/null 2>&1; then
            CAP=$STATECAP
            fsection model_manifest "$i" 15 llmfleet_model_manifest "$p"
            CAP=$SMALLCAP
        fi
        fsection df "model$i" 10 df_for "$p"
        i=$((i + 1))
    done
}

# run_bounded SECONDS CMD...: CMD with a time limit, with or without timeout(1).
# With FN=yes, CMD is a shell function: timeout(1) cannot run those, so a watchdog does.
run_bounded() {
    rb_secs=$1
    shift
    if [ "$HAVE_TIMEOUT" = yes ] && [ "$FN" != yes ]; then
        timeout -k 2 "$rb_secs" "$@"
        return $?
    fi
    "$@" &
    rb_pid=$!
    ( sleep "$rb_secs"; kill -TERM "$rb_pid" 2>/dev/null; sleep 2; kill -KILL "$rb_pid" 2>/dev/null ) \
        </dev/null >/dev/null 2>&1 &
    rb_dog=$!
    wait "$rb_pid"
    rb_rc=$?
    kill "$rb_dog" 2>/dev/null
    return $rb_rc
}

cap_output() {
    if [ "$HAVE_HEAD" = yes ]; then
        head -c "$1"
    else
        dd bs=1024 count=$(($1 / 1024)) 2>/dev/null
    fi
}

# fsection NAME ARG SECONDS FUNCTION...: the same for a shell function of this script.
fsection() {
    FN=yes
    section "$@"
    FN=no
}

# section NAME ARG SECONDS CMD...
section() {
    s_name=$1
    s_arg=$2
    s_secs=$3
    shift 3
    printf '==%s== begin %s %s\n' "$MARK" "$s_name" "$s_arg"
    s_t0=""
    if [ "$HAVE_UPTIME" = yes ] && read -r s_up _ </proc/uptime 2>/dev/null; then s_t0=${s_up%.*}${s_up#*.}; fi
    s_rc=""
    if [ -n "$TMPD" ]; then
        rm -f "$TMPD/rc.$GROUP"
        { run_bounded "$s_secs" "$@" </dev/null 2>&1; echo "$?" >"$TMPD/rc.$GROUP"; } | cap_output $((CAP + 1))
        s_rc=$(cat "$TMPD/rc.$GROUP" 2>/dev/null)
    else
        run_bounded "$s_secs" "$@" </dev/null 2>&1 | cap_output $((CAP + 1))
    fi
    if [ -n "$s_t0" ] && read -r s_up _ </proc/uptime 2>/dev/null; then
        s_cs=$((${s_up%.*}${s_up#*.} - s_t0))
        printf '\n==%s== end %s rc=%s t=%d.%02d\n' "$MARK" "$s_name" "${s_rc:-unknown}" $((s_cs / 100)) $((s_cs % 100))
    else
        printf '\n==%s== end %s rc=%s\n' "$MARK" "$s_name" "${s_rc:-unknown}"
    fi
    LAST_RC=${s_rc:-unknown}
}

meta_info() {
    echo "probe_version=$PROBE_VERSION"
    echo "kernel=$(uname -r 2>/dev/null)"
    echo "machine=$(uname -m 2>/dev/null)"
    echo "uid=$(id -u 2>/dev/null)"
    if [ -d /run/systemd/system ]; then echo "systemd=yes"; else echo "systemd=no"; fi
    echo "timeout=$HAVE_TIMEOUT"
    echo "root=$ROOT"
}

tool_paths() {
    for t in nvidia-smi docker docker-compose nvidia-ctk nvidia-container-cli nvidia-container-runtime \
        nvidia-container-runtime-hook nvidia-container-toolkit ss timeout systemctl; do
        p=$(command -v "$t" 2>/dev/null)
        echo "$t=$p"
    done
}

list_cuda_compat() {
    for d in /usr/local/cuda*/compat; do
        [ -d "$d" ] && echo "$d"
    done
    return 0
}

list_cdi() {
    for d in /etc/cdi /var/run/cdi; do
        [ -d "$d" ] || continue
        for f in "$d"/*; do
            [ -f "$f" ] || continue
            echo "file=$f"
            grep -m 5 -E '^[[:space:]]*"?kind"?[[:space:]]*:' "$f" 2>/dev/null
        done
    done
    return 0
}

cat_proc_net_tcp() {
    cat /proc/net/tcp 2>/dev/null
    cat /proc/net/tcp6 2>/dev/null
    return 0
}

# df for a path, or its nearest existing parent (the folder may not exist yet).
df_for() {
    p=$1
    while [ -n "$p" ] && [ ! -e "$p" ]; do
        p=${p%/*}
    done
    [ -n "$p" ] || p=/
    echo "path=$p"
    df -Pk "$p"
}

show_model() {
    p=$1
    echo "path=$p"
    if [ -d "$p" ]; then
        echo "type=dir"
        if [ -r "$p" ] && [ -x "$p" ]; then echo "readable=yes"; else echo "readable=no"; fi
        echo "entries:"
        ls -lnA "$p" 2>&1 | head -n 2000
    elif [ -f "$p" ]; then
        echo "type=file"
        if [ -r "$p" ]; then echo "readable=yes"; else echo "readable=no"; fi
        echo "ls=$(ls -lnd "$p" 2>/dev/null)"
        echo "magic=$(head -c 4 "$p" 2>/dev/null | tr -dc 'A-Za-z0-9')"
    elif [ -e "$p" ]; then
        echo "type=other"
    else
        echo "type=missing"
    fi
    return 0
}

probe_main "$@" </dev/null
