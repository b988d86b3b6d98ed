#!/bin/bash
# One call on a GPU machine without network (docs/benchmarks.md, "On a GPU"): install the
# wheelhouse `make wheelhouse` built (.whl/) over the image's Python, then, each part under its
# own time limit inside one budget (default 460 s): `bench rollout --device cuda` at the 1.5B
# shape (the HF engine's dynamic-cache loop, its fast path from a bf16 copy and under autocast,
# transformers' generate eager and static + compiled),
# `bench shape` (three training rounds at the 1.5B shape, the memory plan against the measured
# peak), the same rounds with a rollout worker sampling beside the update (d = 1; against the
# in-process rounds of shape-1.5b), tests/gpu, then `bench rollout` at the Llama-3.2-1B and
# tiny shapes while time is left. Prints one JSON (also $OUT/gpu-check.json); each part's JSON and log are in $OUT.
#
#   OUT=/some/dir bash scripts/gpu/check.sh
#
# Environment: OUT (default out/gpu-check), WHEELS (default .whl; absent: use the current
# Python as it is), DEVICE (cuda; cpu runs the same parts small, to check the script), BUDGET_S,
# PARTS (a subset of: rollout-1.5b shape-1.5b overlap-1.5b pytest rollout-llama rollout-tiny),
# PY.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
OUT=${OUT:-$ROOT/out/gpu-check}
mkdir -p "$OUT"
DEVICE=${DEVICE:-cuda}
WHEELS=${WHEELS:-$ROOT/.whl}
BUDGET_S=${BUDGET_S:-460}
PARTS=${PARTS:-rollout-1.5b shape-1.5b overlap-1.5b pytest rollout-llama rollout-tiny}
PY=${PY:-python3}
CACHE=${CACHE:-/tmp/mutualrl-gpu-check}
mkdir -p "$CACHE"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
START=$(date +%s)
left() { echo $(( BUDGET_S - ($(date +%s) - START) )); }
say() { echo "[$(( $(date +%s) - START )) s] $*" >&2; }

if ls "$WHEELS"/*.whl >/dev/null 2>&1; then
  SITE=${SITE:-/tmp/mutualrl-site}
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" "$WHEELS"/*.whl >"$OUT/pip.log" 2>&1 || say "pip install failed (pip.log)"
  export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
  export PATH=$SITE/bin:$WHEELS/bin:$PATH LD_LIBRARY_PATH=$WHEELS/bin:${LD_LIBRARY_PATH:-}
  say "installed $(ls "$WHEELS"/*.whl | wc -l) wheels into $SITE"
fi
{
  "$PY" -c "import json, platform, torch, transformers; print(json.dumps({'python': platform.python_version(), 'torch': torch.__version__, 'transformers': transformers.__version__, 'cuda': torch.version.cuda, 'device': torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'cpu', 'gpu_memory_gib': torch.cuda.get_device_properties(0).total_memory / 2**30 if torch.cuda.is_available() else None}))"
} >"$OUT/env.json" 2>"$OUT/env.log" || say "environment check failed (env.log)"
"$PY" -c "import mutualrl.trainer.runtime.loop, mutualrl.bench.rollout, mutualrl.launch.up" \
  >>"$OUT/env.log" 2>&1 || say "imports failed (env.log)"
command -v redis-server >/dev/null && redis-server --version >>"$OUT/env.log" 2>&1

if [ "$DEVICE" = cuda ]; then  # the sizes the figures of record are taken at
  BIG="--prompts 32 --group 8 --new-tokens 256"; REPEATS=2; ROUNDS="--rounds 3"
  SHAPE_RUN="--prompts 32 --group 8 --new-tokens 256"
else  # the same parts, small: the script's own check on a CPU
  BIG="--prompts 2 --group 2 --new-tokens 8"; REPEATS=1; ROUNDS="--rounds 2"
  SHAPE_RUN="--prompts 2 --group 2 --new-tokens 8"
fi
BIG_SHAPE=qwen2.5-1.5b; LLAMA_SHAPE=llama-3.2-1b
[ "$DEVICE" = cuda ] || { BIG_SHAPE=tiny; LLAMA_SHAPE=tiny; }

# part NAME MAX_S CMD...: run CMD with at most MAX_S seconds (fewer when the budget is short).
part() {
  local name=$1 max=$2; shift 2
  local t=$(left)
  [ "$t" -lt "$max" ] && max=$t
  if [ "$max" -lt 20 ]; then
    say "$name: skipped, ${t} s of the budget left"
    echo "{\"skipped\": \"budget\", \"left_s\": $t}" >"$OUT/$name.status.json"
    return
  fi
  local t0=$(date +%s)
  timeout --kill-after=10 "$max" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  echo "{\"rc\": $rc, \"wall_s\": $(( $(date +%s) - t0 )), \"limit_s\": $max}" \
    >"$OUT/$name.status.json"
  say "$name: rc=$rc in $(( $(date +%s) - t0 )) s"
}

for p in $PARTS; do case $p in
rollout-1.5b)
  part rollout-1.5b 210 "$PY" -m mutualrl.cli bench rollout --device "$DEVICE" \
    --shape "$BIG_SHAPE" $BIG --repeats $REPEATS --cache-dir "$CACHE" \
    --engines hf_loop,hf,hf_autocast,generate,generate_static \
    --json "$OUT/rollout-1.5b.json" ;;
shape-1.5b)
  part shape-1.5b 120 "$PY" -m mutualrl.cli bench shape --device "$DEVICE" \
    --shape "$BIG_SHAPE" $SHAPE_RUN $ROUNDS --cache-dir "$CACHE" --json "$OUT/shape-1.5b.json" ;;
overlap-1.5b)
  part overlap-1.5b 150 "$PY" -m mutualrl.cli bench shape --device "$DEVICE" \
    --shape "$BIG_SHAPE" $SHAPE_RUN $ROUNDS --max-off-policy-steps 1 --cache-dir "$CACHE" \
    --json "$OUT/overlap-1.5b.json" ;;
pytest)
  part pytest 150 "$PY" -m pytest -q -p no:cacheprovider tests/gpu -rs \
    --junitxml "$OUT/pytest.xml" ;;
rollout-llama)
  part rollout-llama 90 "$PY" -m mutualrl.cli bench rollout --device "$DEVICE" \
    --shape "$LLAMA_SHAPE" $BIG --repeats 1 --cache-dir "$CACHE" \
    --engines hf_loop,hf,generate --json "$OUT/rollout-llama.json" ;;
rollout-tiny)
  part rollout-tiny 60 "$PY" -m mutualrl.cli bench rollout --device "$DEVICE" --shape tiny \
    $BIG --repeats $REPEATS --cache-dir "$CACHE" --json "$OUT/rollout-tiny.json" ;;
*) say "unknown part $p" ;;
esac; done

"$PY" "$ROOT/scripts/gpu/summary.py" "$OUT" | tee "$OUT/gpu-check.json"
