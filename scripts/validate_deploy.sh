#!/usr/bin/env bash
# Validates the deployment files offline with the standard tools (no engine, no cluster):
#   1. docker-compose.yml against the Compose specification (check-jsonschema); `docker compose
#      config` too where a Compose v2 CLI and a .env exist. Running it is `make compose-test`;
#   2. every kustomization (deploy/k8s/base, deploy/k8s/overlays/*) rendered by kustomize,
#      validated against the Kubernetes OpenAPI schemas in strict mode (kubernetes-validate),
#      its cross-references followed (deploy/k8s/references.py), and the overlays' security
#      settings checked by checkov (deploy/k8s/checkov.yaml); then the same for a run with a
#      policy across two nodes (configs/demo-nodes.yaml as the base's run.yaml, its trainers
#      written by deploy/k8s/trainers.py into a copy of deploy/k8s);
#   3. the Dockerfiles linted by hadolint (deploy/docker/hadolint.yaml). Building them is
#      `make compose-test`;
#   4. generated files and copies up to date: deploy/k8s/base/trainers.yaml and
#      policy-tokens.env (deploy/k8s/trainers.py --check), deploy/k8s/base/run.yaml (a copy of
#      configs/demo.yaml), deploy/docker/constraints-gpu-*.txt (scripts/constraints.py).
# Every check runs; the exit status is 1 when any failed, and each failure is named.
#
# usage: scripts/validate_deploy.sh [REPO]     (default: this script's repository)
# environment:
#   K8S_VERSION  Kubernetes version to validate against (default 1.32.0)
#   VENV         virtual environment with check-jsonschema, kubernetes-validate and the
#                mutualrl packages (default REPO/.venv)
#   DEPLOY_VENV  virtual environment with hadolint and checkov (default REPO/.venv-deploy,
#                `make deploy-tools`)
set -uo pipefail
export LC_ALL=C

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
REPO="$(cd "${1:-$HERE}" && pwd)"
K8S_VERSION="${K8S_VERSION:-1.32.0}"
VENV="${VENV:-$HERE/.venv}"
DEPLOY_VENV="${DEPLOY_VENV:-$HERE/.venv-deploy}"
K8S="$REPO/deploy/k8s"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
failed=()
passed=0

pass() {
    passed=$((passed + 1))
    printf 'ok    %s\n' "$1"
}
fail() { # name, output
    failed+=("$1")
    printf 'FAIL  %s\n' "$1"
    [ -n "${2:-}" ] && printf '%s\n' "$2" | sed 's/^/      /'
}
# `run NAME COMMAND...`: one named check, passed when the command exits 0.
run() {
    local name="$1" out
    shift
    if out="$("$@" 2>&1)"; then pass "$name"; else fail "$name" "$out"; fi
}
tool() { # name -> its path in a venv, else on PATH
    local venv
    for venv in "$VENV" "$DEPLOY_VENV"; do
        [ -x "$venv/bin/$1" ] && { printf '%s\n' "$venv/bin/$1"; return; }
    done
    command -v "$1" || { echo "validate-deploy: $1 not found (make setup deploy-tools)" >&2; exit 2; }
}
PYTHON="$(tool python)"
CHECK_JSONSCHEMA="$(tool check-jsonschema)"
KUBERNETES_VALIDATE="$(tool kubernetes-validate)"
HADOLINT="$(tool hadolint)"
CHECKOV="$(tool checkov)"
command -v kubectl >/dev/null || { echo "validate-deploy: kubectl not found" >&2; exit 2; }

# ---- 1. compose ----------------------------------------------------------------------------------
compose="$REPO/docker-compose.yml"
run "compose: Compose specification schema" \
    "$CHECK_JSONSCHEMA" --builtin-schema vendor.compose-spec "$compose"
if docker compose version >/dev/null 2>&1 && [ -f "$REPO/.env" ]; then
    run "compose: docker compose config" \
        docker compose -f "$compose" --profile cpu --profile gpu --profile redis-cluster config --quiet
fi

# ---- 2. Kubernetes -------------------------------------------------------------------------------
mkdir -p "$WORK/overlays"
# `kubernetes K8S_DIR SUFFIX`: the base and every overlay of K8S_DIR, rendered, validated and
# cross-checked (each check named with SUFFIX); the overlays are kept for checkov.
kubernetes() {
    local k8s="$1" suffix="$2" dir target rendered out
    for dir in "$k8s/base" "$k8s"/overlays/*/; do
        dir="${dir%/}"
        target="${dir#"$k8s"/}$suffix"
        rendered="$WORK/$(printf '%s' "$target" | tr -c 'a-z0-9-' _).yaml"
        if ! out="$(kubectl kustomize "$dir" 2>&1 >"$rendered")"; then
            fail "kubernetes $target: kustomize" "$out"
            continue
        fi
        pass "kubernetes $target: kustomize ($(grep -c '^kind:' "$rendered") objects)"
        # An unknown kind or apiVersion is only a WARN of kubernetes-validate (exit 0): a failure.
        out="$("$KUBERNETES_VALIDATE" --strict --quiet -k "$K8S_VERSION" - <"$rendered" 2>&1)"
        if [ $? -ne 0 ] || grep -qE '^(ERROR|WARN|FATAL)' <<<"$out"; then
            fail "kubernetes $target: schemas (kubernetes-validate --strict)" "$out"
        else
            pass "kubernetes $target: schemas (kubernetes-validate --strict)"
        fi
        run "kubernetes $target: references" "$PYTHON" "$K8S/references.py" "$target" "$rendered"
        # The base is namespace-less on purpose: the overlays are what gets deployed.
        [ "${target%"$suffix"}" = base ] || cp "$rendered" "$WORK/overlays/"
    done
}
kubernetes "$K8S" ""
# A policy across two nodes: the same files, the trainers written for configs/demo-nodes.yaml.
cp -r "$K8S" "$WORK/k8s-nodes"
cp "$REPO/configs/demo-nodes.yaml" "$WORK/k8s-nodes/base/run.yaml"
if out="$("$PYTHON" "$K8S/trainers.py" --base "$WORK/k8s-nodes/base" 2>&1)"; then
    kubernetes "$WORK/k8s-nodes" " (two-node policy)"
else
    fail "generated: trainers of configs/demo-nodes.yaml" "$out"
fi
run "kubernetes overlays: security settings (checkov)" \
    "$CHECKOV" --config-file "$K8S/checkov.yaml" -d "$WORK/overlays"

# ---- 3. Dockerfiles ------------------------------------------------------------------------------
for file in "$REPO"/deploy/docker/Dockerfile.*; do
    case "$file" in *.dockerignore) continue ;; esac
    run "docker $(basename "$file"): hadolint" \
        "$HADOLINT" --no-color --config "$REPO/deploy/docker/hadolint.yaml" "$file"
done

# ---- 4. generated files and copies ---------------------------------------------------------------
run "generated: deploy/k8s/base trainers and tokens follow run.yaml" \
    "$PYTHON" "$K8S/trainers.py" --base "$K8S/base" --check
run "copies: deploy/k8s/base/run.yaml is configs/demo.yaml" \
    cmp "$REPO/configs/demo.yaml" "$K8S/base/run.yaml"
run "generated: deploy/docker/constraints-gpu-{sglang,vllm}.txt follow their sets" \
    "$PYTHON" "$HERE/scripts/constraints.py" --check-gpu --root "$REPO"

if [ "${#failed[@]}" -gt 0 ]; then
    printf 'validate-deploy: FAILED %d check(s), %d passed:\n' "${#failed[@]}" "$passed"
    printf '  - %s\n' "${failed[@]}"
    exit 1
fi
printf 'validate-deploy: OK (%d checks)\n' "$passed"
