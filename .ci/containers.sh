#!/usr/bin/env bash
# Makes this CI machine able to build and run the project's images, then prints the environment
# scripts/compose_test.sh reads (eval "$(bash .ci/containers.sh)").
#
# Why this exists: CI runs in a sandboxed VM with no Docker daemon, no reachable image registry
# and no CAP_SYS_RESOURCE. A user's Docker (or podman on a normal host) needs none of this:
#   - podman, buildah and runc come from Debian's packages (podman-compose is a deploy tool of
#     the project's own, deploy/tools.txt);
#   - no registry answers, so the base images the Dockerfiles name (python:3.11-slim-bookworm,
#     redis:7) are built locally with mmdebstrap from Debian's packages and passed by tag (the
#     Redis one with protected mode off, as the official image is built);
#   - crun (podman's default runtime) fails on setrlimit without CAP_SYS_RESOURCE and refuses the
#     hybrid cgroup layout; runc works once the OCI bundle asks for no rlimits, so runc runs
#     through a wrapper that deletes process.rlimits from config.json;
#   - pip inside a build reaches PyPI only through this machine's CA bundle, and the CPU torch
#     wheel comes from pip's local find-links directory instead of PyTorch's index.
set -euo pipefail

WRAPPER=/usr/local/libexec/mutualrl-ci/runc-no-rlimits
PYTHON_BASE=localhost/mutualrl-ci/python:3.11-bookworm-headers
REDIS_BASE=localhost/mutualrl-ci/redis:7-bookworm
log() { printf '[containers] %s\n' "$*" >&2; }

# ---- tools ---------------------------------------------------------------------------------------
need=()
for tool in podman buildah runc mmdebstrap curl; do
    command -v "$tool" >/dev/null 2>&1 || need+=("$tool")
done
if [ "${#need[@]}" -gt 0 ]; then
    log "installing Debian's ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >&2
    apt-get install -y -qq podman buildah runc mmdebstrap curl >&2
fi

# ---- runtime: runc without rlimits ---------------------------------------------------------------
mkdir -p "$(dirname "$WRAPPER")" /etc/containers/containers.conf.d
cat >"$WRAPPER" <<'WRAP'
#!/usr/bin/env python3
"""runc, with the rlimits removed from the bundle's config.json (create, run) and from the
process file of an exec: this sandbox lacks CAP_SYS_RESOURCE."""
import json
import os
import sys

args = sys.argv[1:]


def strip(path, key):
    with open(path) as f:
        spec = json.load(f)
    section = spec.get("process", {}) if key == "process" else spec
    if section.pop("rlimits", None) is not None:
        with open(path, "w") as f:
            json.dump(spec, f)


for flags, name, key in ((("--bundle", "-b"), "config.json", "process"),
                         (("--process", "-p"), "", "")):
    for flag in flags:
        if flag in args:
            value = args[args.index(flag) + 1]
            strip(os.path.join(value, name) if name else value, key)
os.execvp("runc", ["runc", *args])
WRAP
chmod 755 "$WRAPPER"
cat >/etc/containers/containers.conf.d/50-mutualrl-ci.conf <<CONF
# Written by .ci/containers.sh: runc without rlimits (this sandbox lacks CAP_SYS_RESOURCE);
# cgroupfs and a file for events, since no systemd runs here.
[engine]
runtime = "runc-no-rlimits"
cgroup_manager = "cgroupfs"
events_logger = "file"

[engine.runtimes]
runc-no-rlimits = ["$WRAPPER"]
CONF

# ---- base images ---------------------------------------------------------------------------------
# Built once per machine and kept in podman's storage.
base_image() { # tag, packages (comma-separated), workdir, [file to add as /usr/local/bin/NAME]
    local tag="$1" packages="$2" workdir="$3" extra="${4:-}" dir ctr
    podman image exists "$tag" && return 0
    log "building base image $tag from Debian bookworm ($packages)"
    dir="$(mktemp -d)"
    mmdebstrap --quiet --variant=minbase --include="$packages" bookworm "$dir/rootfs.tar" >&2
    ctr="$(buildah from scratch)"
    buildah add --quiet "$ctr" "$dir/rootfs.tar" / >/dev/null
    if [ -n "$extra" ]; then
        buildah add --quiet --chmod 755 "$ctr" "$extra" "/usr/local/bin/$(basename "$extra")" >/dev/null
    fi
    buildah config --workingdir "$workdir" \
        --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "$ctr"
    buildah commit --quiet --rm "$ctr" "$tag" >/dev/null
    rm -rf "$dir"
}
# The interpreter's headers too, as the official python image has them: the vllm-cpu image
# compiles kernels with torch inductor against them.
base_image "$PYTHON_BASE" python3,python3-venv,python3-dev,python-is-python3,ca-certificates,passwd /
# The official redis image is built with protected mode off (containers reach Redis over their
# network, not loopback); Debian's is not, so its redis-server gets the flag from a wrapper.
redis_wrapper="$(mktemp -d)/redis-server"
printf '#!/bin/sh\nexec /usr/bin/redis-server "$@" --protected-mode no\n' >"$redis_wrapper"
base_image "$REDIS_BASE" redis-server,redis-tools,hostname /data "$redis_wrapper"
rm -rf "$(dirname "$redis_wrapper")"

# ---- what the builds need ------------------------------------------------------------------------
ca="${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}"
links="${PIP_FIND_LINKS:-$(pip config get global.find-links 2>/dev/null || true)}"
volumes="$ca:/etc/ssl/certs/ca-certificates.crt:ro"
torch_args=""
if [ -n "$links" ] && compgen -G "$links/torch-*.whl" >/dev/null; then
    volumes+=" $links:/wheels:ro"
    torch_args="--no-index --find-links /wheels"
fi
printf 'export MUTUALRL_PYTHON_IMAGE=%q\n' "$PYTHON_BASE"
printf 'export MUTUALRL_REDIS_IMAGE=%q\n' "$REDIS_BASE"
printf 'export MUTUALRL_TORCH_PIP_ARGS=%q\n' "$torch_args"
printf 'export COMPOSE_TEST_BUILD_VOLUMES=%q\n' "$volumes"
