#!/usr/bin/env bash
# Validates the deployment files offline (no Docker engine, no cluster, no network):
#   1. docker-compose.yml against the Compose specification (check-jsonschema, vendored schema),
#      then its cross-references (deploy/validate_policies.py compose), then, only where a
#      Docker Compose CLI and a .env exist, `docker compose config`;
#   2. every kustomization (deploy/k8s/base and each deploy/k8s/overlays/*) rendered with
#      kustomize and validated against the Kubernetes OpenAPI schemas in strict mode
#      (kubernetes-validate, schemas shipped in the package), then the project's rules
#      (requests/limits, non-root, gRPC probes, selectors, references: validate_policies.py k8s);
#   3. copies that must not drift: the service image's requirements vs pyproject.toml, and the
#      Kubernetes run config (deploy/k8s/base/run.yaml) vs configs/demo.yaml;
#   4. the installed package as the images run it: every module of the service packages imports
#      with only the service image's distributions importable (requirements-service.txt and what
#      they require; torch, matplotlib, tensorboard and the rest blocked), and every
#      `mutualrl ...` command and healthcheck in the compose file and manifests parses with the
#      real CLI.
# Every check runs; the exit status is 1 when any failed, and each failure is named.
#
# usage: scripts/validate_deploy.sh [COMPOSE_FILE] [K8S_DIR]
#   COMPOSE_FILE  default <repo>/docker-compose.yml; pyproject.toml and configs/demo.yaml are
#                 looked up next to it
#   K8S_DIR       default <repo>/deploy/k8s (base/, overlays/*/, components/); the service
#                 requirements are looked up in K8S_DIR/../docker/
# environment:
#   K8S_VERSION   Kubernetes version to validate against (default 1.32.0; kubernetes-validate
#                 ships offline schemas for 1.25 to 1.37)
#   VENV          virtual environment holding check-jsonschema, kubernetes-validate and the
#                 installed mutualrl package (default <repo>/.venv; falls back to PATH)
#   VALIDATE_DEPLOY_PACKAGE=0  skips step 4 (tests that plant errors in copies of the files)
set -uo pipefail
# Byte order for globs, so overlays are checked in the same order everywhere.
export LC_ALL=C

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
COMPOSE_FILE="${1:-$REPO/docker-compose.yml}"
K8S_DIR="${2:-$REPO/deploy/k8s}"
K8S_VERSION="${K8S_VERSION:-1.32.0}"
VENV="${VENV:-$REPO/.venv}"
POLICIES="$REPO/deploy/validate_policies.py"

failed=()
passed=0
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

say() { printf '%s\n' "$*"; }
fail() { # check-name, message...
    local name="$1"
    shift
    failed+=("$name")
    say "FAIL  $name"
    [ "$#" -gt 0 ] && printf '%s\n' "$@" | sed 's/^/      /'
}
pass() {
    passed=$((passed + 1))
    say "ok    $1"
}

# A tool from the venv if it is there, else from PATH; empty when neither has it.
tool() {
    if [ -x "$VENV/bin/$1" ]; then
        printf '%s\n' "$VENV/bin/$1"
    else
        command -v "$1" || true
    fi
}

PYTHON="$(tool python)"
[ -n "$PYTHON" ] || PYTHON="$(command -v python3 || true)"
CHECK_JSONSCHEMA="$(tool check-jsonschema)"
KUBERNETES_VALIDATE="$(tool kubernetes-validate)"
if command -v kubectl >/dev/null 2>&1; then
    KUSTOMIZE=(kubectl kustomize)
elif command -v kustomize >/dev/null 2>&1; then
    KUSTOMIZE=(kustomize build)
else
    KUSTOMIZE=()
fi

missing=()
[ -n "$PYTHON" ] || missing+=("python (with pyyaml)")
[ -n "$CHECK_JSONSCHEMA" ] || missing+=("check-jsonschema (pip install -e '.[test]')")
[ -n "$KUBERNETES_VALIDATE" ] || missing+=("kubernetes-validate (pip install -e '.[test]')")
[ "${#KUSTOMIZE[@]}" -gt 0 ] || missing+=("kubectl or kustomize")
if [ "${#missing[@]}" -gt 0 ]; then
    say "validate-deploy: missing tools: ${missing[*]}" >&2
    exit 2
fi

# ---- 1. docker compose ----------------------------------------------------------------------------
say "== compose: $COMPOSE_FILE"
if [ ! -f "$COMPOSE_FILE" ]; then
    fail "compose: file" "$COMPOSE_FILE does not exist"
else
    if out="$("$CHECK_JSONSCHEMA" --builtin-schema vendor.compose-spec "$COMPOSE_FILE" 2>&1)"; then
        pass "compose: Compose specification schema"
    else
        fail "compose: Compose specification schema" "$out"
    fi
    if out="$("$PYTHON" "$POLICIES" compose "$COMPOSE_FILE" 2>&1)"; then
        pass "compose: references and rules"
    else
        fail "compose: references and rules" "$out"
    fi
    compose_cli=()
    if docker compose version >/dev/null 2>&1; then
        compose_cli=(docker compose)
    elif command -v docker-compose >/dev/null 2>&1; then
        compose_cli=(docker-compose)
    fi
    compose_dir="$(dirname "$COMPOSE_FILE")"
    if [ "${#compose_cli[@]}" -eq 0 ]; then
        say "skip  compose: '${compose_cli[*]:-docker compose} config' (no Docker Compose CLI here)"
    elif [ ! -f "$compose_dir/.env" ]; then
        say "skip  compose: '${compose_cli[*]} config' (no .env next to the file: cp .env.example .env)"
    elif out="$("${compose_cli[@]}" -f "$COMPOSE_FILE" --profile cpu --profile gpu config --quiet 2>&1)"; then
        pass "compose: ${compose_cli[*]} config"
    else
        fail "compose: ${compose_cli[*]} config" "$out"
    fi
fi

# ---- 2. Kubernetes ------------------------------------------------------------------------------
say "== kubernetes: $K8S_DIR (schemas of Kubernetes $K8S_VERSION, strict)"
targets=()
[ -f "$K8S_DIR/base/kustomization.yaml" ] && targets+=("base")
for dir in "$K8S_DIR"/overlays/*/; do
    [ -f "$dir/kustomization.yaml" ] && targets+=("overlays/$(basename "$dir")")
done
if [ "${#targets[@]}" -eq 0 ]; then
    fail "kubernetes: kustomizations" "no base/kustomization.yaml or overlays/*/kustomization.yaml under $K8S_DIR"
fi
for target in "${targets[@]}"; do
    rendered="$WORK/$(printf '%s' "$target" | tr '/' '_').yaml"
    if ! out="$("${KUSTOMIZE[@]}" "$K8S_DIR/$target" 2>&1 >"$rendered")"; then
        fail "kubernetes $target: kustomize build" "$out"
        rm -f "$rendered"
        continue
    fi
    pass "kubernetes $target: kustomize build ($(grep -c '^kind:' "$rendered") objects)"
    # kubernetes-validate reads the multi-document stream from stdin ("-"); --quiet prints only
    # problems. An unknown kind/apiVersion is only a WARN there (exit 0): count it as a failure.
    out="$("$KUBERNETES_VALIDATE" --strict --quiet -k "$K8S_VERSION" - <"$rendered" 2>&1)"
    rc=$?
    if [ "$rc" -ne 0 ] || printf '%s\n' "$out" | grep -qE '^(ERROR|WARN|FATAL)'; then
        fail "kubernetes $target: schema (kubernetes-validate --strict)" \
            "$(printf '%s\n' "$out" | sed 's/^\(ERROR\|WARN\|FATAL\) - /\1 /')"
    else
        pass "kubernetes $target: schema (kubernetes-validate --strict)"
    fi
    if out="$("$PYTHON" "$POLICIES" k8s "$target" - <"$rendered" 2>&1)"; then
        pass "kubernetes $target: references and rules"
    else
        fail "kubernetes $target: references and rules" "$out"
    fi
done

# ---- 3. copies that must not drift --------------------------------------------------------------
say "== copies"
compose_root="$(cd "$(dirname "$COMPOSE_FILE")" 2>/dev/null && pwd)"
requirements="$K8S_DIR/../docker/requirements-service.txt"
if [ -f "$requirements" ] && [ -f "$compose_root/pyproject.toml" ]; then
    if out="$("$PYTHON" "$POLICIES" deps "$compose_root/pyproject.toml" "$requirements" 2>&1)"; then
        pass "copies: service image requirements match pyproject.toml"
    else
        fail "copies: service image requirements match pyproject.toml" "$out"
    fi
else
    say "skip  copies: service requirements (no $requirements or pyproject.toml next to the compose file)"
fi
if [ -f "$K8S_DIR/base/run.yaml" ]; then
    if out="$("$PYTHON" "$POLICIES" same "$compose_root/configs/demo.yaml" "$K8S_DIR/base/run.yaml" 2>&1)"; then
        pass "copies: deploy/k8s/base/run.yaml is configs/demo.yaml"
    else
        fail "copies: deploy/k8s/base/run.yaml is configs/demo.yaml" "$out"
    fi
fi

# ---- 4. the package as the images run it --------------------------------------------------------
if [ "${VALIDATE_DEPLOY_PACKAGE:-1}" = "0" ]; then
    say "skip  package checks (VALIDATE_DEPLOY_PACKAGE=0)"
else
    say "== package: the installed mutualrl, as the images run it"
    out="$("$PYTHON" "$POLICIES" imports "$requirements" 2>&1)"
    rc=$?
    # transformers announces on import that it runs without torch; that is the point here.
    out="$(printf '%s\n' "$out" | grep -v '^\[transformers\] PyTorch was not found' || true)"
    if [ "$rc" -eq 0 ]; then
        pass "package: service modules import with only the service image's dependencies"
    else
        fail "package: service modules import with only the service image's dependencies" "$out"
    fi
    rendered_all=("$WORK"/*.yaml)
    [ -e "${rendered_all[0]}" ] || rendered_all=()
    if out="$("$PYTHON" "$POLICIES" cli "$COMPOSE_FILE" "${rendered_all[@]}" 2>&1)"; then
        pass "package: compose and Kubernetes commands parse with the mutualrl CLI"
    else
        fail "package: compose and Kubernetes commands parse with the mutualrl CLI" "$out"
    fi
fi

# ---- summary ------------------------------------------------------------------------------------
if [ "${#failed[@]}" -gt 0 ]; then
    say "validate-deploy: FAILED ${#failed[@]} check(s), $passed passed:"
    printf '  - %s\n' "${failed[@]}"
    exit 1
fi
say "validate-deploy: OK ($passed checks)"
