#!/usr/bin/env bash
# The device check: what the library does on one CUDA GPU, in about 8 minutes, into one folder.
#
#   tools/gpu_check.sh [--out DIR] [--wheels DIR] [--cpu-dry-run]
#
# Run from the repository root on a machine with one CUDA GPU and torch installed (no network
# needed). Phases, in priority order, each in its own process group with its own time limit (a
# hang costs only that phase); DIR/check.json is rewritten after each phase:
#   1. environment   the GPU, driver, CUDA, Triton, torch; what the cache header records (25 s)
#   2. gpu_tests     python -m pytest -m gpu tests/gpu (junit in gpu_tests.xml), but the
#                    warm-restart test, which phase 3 runs at a larger size                (200 s)
#   3. restart       a cold and a warm process through compile_cache(precompile=True) on a
#                    4-layer GPT-2: each region's path, cache hits, Triton kernels, losses,
#                    checked as the GPU suite's restart test checks them                    (80 s)
#   4. bench         torchcompile-kit bench --preset full-size eager regional regional-warm,
#                    40 steady steps after 5 of warm-up (the post's sizes, bf16 autocast)  (170 s)
# --wheels DIR: pure-Python wheels (the project's pinned transformers and peft) installed into a
#   private folder first, for a machine whose transformers is older than the project's floor.
# --cpu-dry-run: every phase on the CPU (tests with TORCHCOMPILE_KIT_GPU_DRY_RUN=1, the bench at
#   --preset tiny, every limit 4 times longer): the script itself checked without a GPU. Without
#   it, a machine where torch sees no CUDA device stops at once.
set -uo pipefail
cd "$(dirname "$0")/.."

OUT="gpu-check-$(date -u +%Y%m%d-%H%M%S)"
WHEELS=""
DRY_RUN=0
while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUT="$2"; shift 2 ;;
    --wheels) WHEELS="$2"; shift 2 ;;
    --cpu-dry-run) DRY_RUN=1; shift ;;
    -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { print }' "$0"; exit 0 ;;
    *) echo "gpu_check.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
PYTHON="${PYTHON:-python3}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"

if [ -n "$WHEELS" ]; then
  SITE="$OUT/site"
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --target "$SITE" "$WHEELS"/*.whl \
    || { echo "gpu_check.sh: installing the wheels in $WHEELS failed" >&2; exit 2; }
  export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

if [ "$DRY_RUN" = 1 ]; then
  export TORCHCOMPILE_KIT_GPU_DRY_RUN=1 TORCHCOMPILE_KIT_BENCH_DEVICE=cpu
  DEVICE=cpu PRESET=tiny SCALE=4 BENCH_STEPS=""
else
  if ! "$PYTHON" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "gpu_check.sh: torch sees no CUDA device here ($("$PYTHON" -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda)' 2>&1)); this check needs one GPU. Use --cpu-dry-run to test the script itself on a CPU." >&2
    exit 3
  fi
  DEVICE=cuda PRESET=full-size SCALE=1 BENCH_STEPS="--steps 40 --warmup-steps 5"
fi

# check.json: {"dry_run":, "phases": {name: {rc, seconds, timed_out, limit_s}}}, rewritten after each phase
record() {  # record NAME RC SECONDS LIMIT
  "$PYTHON" - "$OUT/check.json" "$1" "$2" "$3" "$4" "$DRY_RUN" <<'EOF'
import json, os, sys
path, name, rc, seconds, limit, dry = sys.argv[1:]
data = json.load(open(path)) if os.path.exists(path) else {"dry_run": dry == "1", "phases": {}}
data["phases"][name] = {"rc": int(rc), "seconds": int(seconds), "limit_s": int(limit),
                        "timed_out": int(rc) in (124, 137, 143)}
json.dump(data, open(path + ".tmp", "w"), indent=2)
os.replace(path + ".tmp", path)
EOF
}

phase() {  # phase NAME LIMIT_S COMMAND...: COMMAND in its own process group, killed at LIMIT_S
  local name=$1 limit=$(( $2 * SCALE )) start rc
  shift 2
  echo "== $name (limit ${limit} s)" >&2
  start=$(date +%s)
  setsid bash -c "$*" >"$OUT/$name.log" 2>&1 &
  local pid=$!
  ( sleep "$limit"; kill -TERM -- "-$pid" 2>/dev/null; sleep 5; kill -KILL -- "-$pid" 2>/dev/null ) &
  local watchdog=$!
  wait "$pid"
  rc=$?
  kill "$watchdog" 2>/dev/null
  wait "$watchdog" 2>/dev/null
  [ "$(( $(date +%s) - start ))" -ge "$limit" ] && rc=124
  record "$name" "$rc" "$(( $(date +%s) - start ))" "$limit"
  echo "   rc $rc in $(( $(date +%s) - start )) s; log $OUT/$name.log" >&2
  tail -n 3 "$OUT/$name.log" >&2
}

phase environment 25 "'$PYTHON' - '$OUT/environment.json' <<'EOF'
import json, subprocess, sys
import torch, transformers, peft
from torchcompile_kit.bench.results import environment
from torchcompile_kit.cache import current_environment
env = {'bench': environment(), 'cache_header': current_environment(),
       'transformers_file': transformers.__file__, 'peft': peft.__version__}
if torch.cuda.is_available():
    env['nvidia_smi'] = subprocess.run(['nvidia-smi', '--query-gpu=name,driver_version,memory.total,memory.used', '--format=csv'],
                                       capture_output=True, text=True).stdout
json.dump(env, open(sys.argv[1], 'w'), indent=2, default=str)
print(json.dumps(env['bench'], default=str))
EOF"

phase gpu_tests 200 "'$PYTHON' -m pytest -q -p no:cacheprovider -m gpu tests/gpu -rfEs -s --durations=0 --junitxml='$OUT/gpu_tests.xml' --deselect tests/gpu/test_cache.py::test_a_warm_restart_runs_every_region_precompiled_with_the_same_losses"

phase restart 80 "
  rm -rf '$OUT/restart' && mkdir -p '$OUT/restart'
  for mode in cold warm; do
    TORCHINDUCTOR_CACHE_DIR='$OUT/restart/inductor-'\$mode TRITON_CACHE_DIR='$OUT/restart/triton-'\$mode \
      '$PYTHON' tests/gpu/restart_worker.py \$mode '$OUT/restart/cc.tck' $DEVICE 4 >'$OUT/restart/'\$mode.json || exit 1
  done
  '$PYTHON' tests/gpu/restart_worker.py compare '$OUT/restart' $DEVICE"

phase bench 170 "'$PYTHON' -m torchcompile_kit bench eager regional regional-warm --preset $PRESET $BENCH_STEPS --device $DEVICE --no-charts --out '$OUT/bench'"

"$PYTHON" -c "import json, sys; d = json.load(open(sys.argv[1])); print(json.dumps(d, indent=2))" "$OUT/check.json"
echo "gpu_check.sh: everything is in $OUT" >&2
