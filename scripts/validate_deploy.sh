#!/usr/bin/env bash
# Validates the deployment files offline (no Docker engine, no cluster, no network):
#   1. docker-compose.yml against the Compose specification (check-jsonschema, vendored schema),
#      then its cross-references (deploy/validate_policies.py compose), then, only where a
#      Docker Compose CLI and a .env exist, `docker compose config`;
#   2. every kustomization (deploy/k8s/base and each deploy/k8s/overlays/*) rendered with
#      kustomize and validated against the Kubernetes OpenAPI schemas in strict mode
#      (kubernetes-validate, schemas shipped in the package), then the project's rules
#      (requests/limits, non-root, gRPC probes, selectors, references: validate_policies.py k8s);
#   3. the images, read from their Dockerfiles (deploy/docker/Dockerfile.*): the constraints
#      files hold only `name==version` lines; each Dockerfile's ignore file admits exactly what
#      its COPY instructions read; every pip install takes the workspace packages from COPY'd
#      directories under -c constraints; each image's dependency closure (the packages'
#      pyproject.toml, then the installed metadata) is pinned and, for the service image, holds
#      no torch, matplotlib or tensorboard;
#   4. copies that must not drift: deploy/docker/constraints-gpu.txt vs constraints.txt
#      (scripts/constraints.py --check-gpu), the Kubernetes run config (deploy/k8s/base/run.yaml)
#      vs configs/demo.yaml, the trainers' tokens (deploy/k8s/base/policy-tokens.env) vs the
#      secret they derive from (auth.env);
#   5. the packages as the images run them: every module of an image's packages imports with
#      only that image's distributions importable (the rest blocked), and every `mutualrl ...`
#      command and healthcheck in the compose file and manifests parses with the CLI of the
#      image it runs in (only that image's commands registered).
# Every check runs; the exit status is 1 when any failed, and each failure is named.
#
# usage: scripts/validate_deploy.sh [COMPOSE_FILE] [K8S_DIR]
#   COMPOSE_FILE  default <repo>/docker-compose.yml; its folder is the build context of the
#                 images (constraints.txt, the package directories, configs/demo.yaml)
#   K8S_DIR       default <repo>/deploy/k8s (base/, overlays/*/, components/); the Dockerfiles
#                 are K8S_DIR/../docker/Dockerfile.*
# environment:
#   K8S_VERSION   Kubernetes version to validate against (default 1.32.0; kubernetes-validate
#                 ships offline schemas for 1.25 to 1.37)
#   VENV          virtual environment holding check-jsonschema, kubernetes-validate and the
#                 installed mutualrl packages (default <repo>/.venv; falls back to PATH)
#   VALIDATE_DEPLOY_SECTIONS  the steps to run, of: compose kubernetes images copies packages
#                 (default all; tests that plant an error in one kind of file run only some)
#   VALIDATE_DEPLOY_PACKAGE=0  skips step 5, "packages" (its checks read the installed packages,
#                 not a copy of the files)
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

compose_root="$(cd "$(dirname "$COMPOSE_FILE")" 2>/dev/null && pwd)"
DOCKER_DIR="$(cd "$K8S_DIR/../docker" 2>/dev/null && pwd || printf %s "$K8S_DIR/../docker")"
# `check NAME validate_policies-args...`: one named check; NOTE lines are shown, not failures.
check() {
    local name="$1" out rc
    shift
    out="$("$PYTHON" "$POLICIES" "$@" 2>&1)"
    rc=$?
    # transformers announces on import that it runs without torch; that is the point here.
    out="$(printf '%s\n' "$out" | grep -v '^\[transformers\] PyTorch was not found' || true)"
    if [ "$rc" -eq 0 ]; then
        pass "$name"
        [ -n "$out" ] && printf '%s\n' "$out" | sed 's/^/      /'
    else
        fail "$name" "$out"
    fi
    return 0
}
dockerfiles=()
for file in "$DOCKER_DIR"/Dockerfile.*; do
    case "$file" in *.dockerignore) continue ;; esac
    [ -f "$file" ] && dockerfiles+=("$file")
done
SECTIONS=" ${VALIDATE_DEPLOY_SECTIONS:-compose kubernetes images copies packages} "
[ "${VALIDATE_DEPLOY_PACKAGE:-1}" = "0" ] && SECTIONS="${SECTIONS/ packages / }"
want() {
    [[ "$SECTIONS" == *" $1 "* ]] && return 0
    say "skip  $1 (not in VALIDATE_DEPLOY_SECTIONS, or VALIDATE_DEPLOY_PACKAGE=0)"
    return 1
}

# ---- 1. docker compose ----------------------------------------------------------------------------
if want compose; then
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
        compose_v1=""
        if docker compose version >/dev/null 2>&1; then
            compose_cli=(docker compose)
        elif command -v docker-compose >/dev/null 2>&1; then
            # Compose 1.x (Debian 12's docker-compose package) predates the Compose
            # Specification: it rejects the top-level `name`, so its verdict means nothing here.
            version="$(docker-compose version --short 2>/dev/null || true)"
            if [[ "$version" == 1.* ]]; then
                compose_v1="$version"
            else
                compose_cli=(docker-compose)
            fi
        fi
        compose_dir="$(dirname "$COMPOSE_FILE")"
        if [ -n "$compose_v1" ]; then
            say "skip  compose: 'docker-compose config' (docker-compose $compose_v1 predates the Compose Specification; Compose v2 checks this)"
        elif [ "${#compose_cli[@]}" -eq 0 ]; then
            say "skip  compose: 'docker compose config' (no Docker Compose CLI here)"
        elif [ ! -f "$compose_dir/.env" ]; then
            say "skip  compose: '${compose_cli[*]} config' (no .env next to the file: cp .env.example .env)"
        elif out="$("${compose_cli[@]}" -f "$COMPOSE_FILE" --profile cpu --profile gpu config --quiet 2>&1)"; then
            pass "compose: ${compose_cli[*]} config"
        else
            fail "compose: ${compose_cli[*]} config" "$out"
        fi
    fi
fi

# ---- 2. Kubernetes ------------------------------------------------------------------------------
if want kubernetes; then
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
fi

# ---- 3. images ----------------------------------------------------------------------------------
if want images; then
    say "== images: $DOCKER_DIR (build context $compose_root)"
    constraint_files=("$compose_root/constraints.txt")
    for file in "$DOCKER_DIR"/constraints*.txt; do
        [ -e "$file" ] && constraint_files+=("$file")
    done
    check "constraints: only name==version pins" constraints "$compose_root" "${constraint_files[@]}"
    if [ "${#dockerfiles[@]}" -eq 0 ]; then
        fail "images: Dockerfiles" "no Dockerfile.* under $DOCKER_DIR"
    fi
    for file in "${dockerfiles[@]}"; do
        name="$(basename "$file")"
        check "image $name: build context (COPY sources, ignore-file allow-list)" \
            context "$compose_root" "$file"
        check "image $name: pip installs (package directories, -c constraints)" \
            pips "$compose_root" "$file"
        check "image $name: dependency closure (pinned, nothing that does not belong)" \
            closure "$compose_root" "$file"
    done
fi

# ---- 4. copies that must not drift --------------------------------------------------------------
if want copies; then
    say "== copies"
    if [ -f "$DOCKER_DIR/constraints-gpu.txt" ]; then
        if out="$("$PYTHON" "$REPO/scripts/constraints.py" --check-gpu --root "$compose_root" 2>&1)"; then
            pass "copies: deploy/docker/constraints-gpu.txt follows constraints.txt"
        else
            fail "copies: deploy/docker/constraints-gpu.txt follows constraints.txt" "$out"
        fi
    fi
    if [ -f "$K8S_DIR/base/run.yaml" ]; then
        if out="$("$PYTHON" "$POLICIES" same "$compose_root/configs/demo.yaml" "$K8S_DIR/base/run.yaml" 2>&1)"; then
            pass "copies: deploy/k8s/base/run.yaml is configs/demo.yaml"
        else
            fail "copies: deploy/k8s/base/run.yaml is configs/demo.yaml" "$out"
        fi
    fi
    if [ -f "$K8S_DIR/base/policy-tokens.env" ]; then
        if out="$("$PYTHON" "$POLICIES" tokens "$K8S_DIR/base/auth.env" "$K8S_DIR/base/policy-tokens.env" 2>&1)"; then
            pass "copies: deploy/k8s/base/policy-tokens.env follows auth.env's secret"
        else
            fail "copies: deploy/k8s/base/policy-tokens.env follows auth.env's secret" "$out"
        fi
    fi
fi

# ---- 5. the packages as the images run them -----------------------------------------------------
if want packages; then
    say "== packages: the installed mutualrl packages, as the images run them"
    # One process per image: blocking the modules an image lacks lasts for the process.
    for file in "${dockerfiles[@]}"; do
        check "package: $(basename "$file") modules import with only that image's distributions" \
            imports "$compose_root" "$file"
    done
    rendered_all=("$WORK"/*.yaml)
    [ -e "${rendered_all[0]}" ] || rendered_all=()
    check "package: compose and Kubernetes commands parse with their image's mutualrl CLI" \
        cli "$compose_root" "$DOCKER_DIR" "$COMPOSE_FILE" "${rendered_all[@]}"
fi

# ---- summary ------------------------------------------------------------------------------------
if [ "${#failed[@]}" -gt 0 ]; then
    say "validate-deploy: FAILED ${#failed[@]} check(s), $passed passed:"
    printf '  - %s\n' "${failed[@]}"
    exit 1
fi
say "validate-deploy: OK ($passed checks)"
