#!/bin/bash
# Builds the wheelhouse a GPU node without network installs from (docs/benchmarks.md, "On a
# GPU"): the workspace's nine packages as wheels, the third-party wheels a bare CUDA + torch
# image lacks (wheelhouse.txt, at constraints.txt's versions, for the node's Python and
# platform), and Debian's redis-server with the libraries it links that such an image has not
# (for `mutualrl up`). Everything lands in one folder, checked against a size limit.
#
#   bash scripts/gpu/wheelhouse.sh [DIR]      (make wheelhouse; DIR defaults to .whl)
#
# Environment: PYTHON (the pip that fetches, default python3), WHEEL_PYTHON (the node's Python,
# default 3.12), WHEEL_PLATFORMS (default the manylinux x86-64 tags), WHEELHOUSE_MAX_MB
# (default 64: what travels to a GPU machine with the repository), REDIS_SERVER (default the
# redis-server on PATH; empty: none).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
DIR=${1:-$ROOT/.whl}
PYTHON=${PYTHON:-python3}
WHEEL_PYTHON=${WHEEL_PYTHON:-3.12}
WHEEL_PLATFORMS=${WHEEL_PLATFORMS:-"manylinux_2_28_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64"}
MAX_MB=${WHEELHOUSE_MAX_MB:-64}
REDIS_SERVER=${REDIS_SERVER-$(command -v redis-server || true)}

rm -rf "$DIR"
mkdir -p "$DIR/bin"
cd "$ROOT"
# The workspace: `./` on every path (a bare `proto` is a PyPI package of that name); the
# in-tree builds leave no build/ folders behind.
packages=(./proto ./services/common ./clients/python ./services/see ./services/thl ./services/mwra
          ./services/trainer ./launcher ./bench)
"$PYTHON" -m pip wheel -q --no-deps --no-build-isolation -w "$DIR" "${packages[@]}"
for p in "${packages[@]}"; do rm -rf "$p/build"; done

pins=()
while read -r name; do
  case "$name" in ''|'#'*) continue ;; esac
  pin=$(grep -i "^${name}==" constraints.txt || true)
  if [ -z "$pin" ]; then
    echo "wheelhouse: $name has no pin in constraints.txt" >&2
    exit 2
  fi
  pins+=("$pin")
done < scripts/gpu/wheelhouse.txt
platforms=()
for p in $WHEEL_PLATFORMS; do platforms+=(--platform "$p"); done
"$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version "$WHEEL_PYTHON" \
  --implementation cp "${platforms[@]}" -d "$DIR" "${pins[@]}"

if [ -n "$REDIS_SERVER" ]; then
  cp "$REDIS_SERVER" "$DIR/bin/redis-server"
  # Beside it, what it links that a CUDA image does not carry (LD_LIBRARY_PATH=$DIR/bin).
  for lib in $(ldd "$REDIS_SERVER" | awk '/=>/ {print $3}'); do
    case "$(basename "$lib")" in liblzf.so.*|libjemalloc.so.*|libatomic.so.*) cp -L "$lib" "$DIR/bin/" ;; esac
  done
fi

size=$(du -sb "$DIR" | cut -f1)
mb=$(( (size + 1048575) / 1048576 ))
echo "wheelhouse: $(ls "$DIR"/*.whl | wc -l) wheels$( [ -n "$REDIS_SERVER" ] && echo " + redis-server") in $DIR, ${mb} MiB"
if [ "$mb" -gt "$MAX_MB" ]; then
  echo "wheelhouse: ${mb} MiB is more than the ${MAX_MB} MiB limit" >&2
  exit 1
fi
