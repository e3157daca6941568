#!/usr/bin/env bash
# `robo-rl demo full=true` (200 demos, 30k pre-training steps at batch 256, one RaC round of 120
# rollouts, a 30k-step retrain, 100 evaluation episodes per row) on a lent GPU machine that has
# PyTorch but no package registry.
#
#   bash bench/gpu_demo.sh [SECONDS] [demo overrides ...]      (default overrides: full=true)
#   SEEDS="2 3" STAGGER_S=55 bash bench/gpu_demo.sh [SECONDS]  (one run per seed, side by side)
#
# The fifth round's H200 row ran the CPU recipe scaled up instead of full=true:
#   bash bench/gpu_demo.sh 470 small.pretrain_steps=20000 small.batch_size=256 small.rounds=2 \
#       small.episodes_per_round=30 small.finetune_steps=3000 small.eval_episodes=100
#
# - Python packages the machine lacks come from `.whl/` (cp312 wheels downloaded beforehand,
#   see bench/README.md), installed into /tmp/site.
# - The demos come from `data/gpu-demos`, a store recorded beforehand with the demo's own teleop
#   step (same task, seed 0, 200 episodes): recording is CPU work that needs no GPU time.
# - The run stops with SIGTERM after SECONDS (default 540): the learner checkpoints, and the next
#   call of this script goes on with `resume=true` from the stages in data/gpu-demo/stages.json.
# - SEEDS runs one demo per seed at once (data/gpu-demo-s<seed>), each started STAGGER_S seconds
#   after the one before: the evaluations and the round are MuJoCo on one CPU core each, so while
#   one seed trains on the GPU the other evaluates, and two seeds take little longer than one.
#   Every run stops at the same deadline, SECONDS after the script started.
# - Results, stage timings and the learner's steps/s are copied to $OUT (or ./data/gpu-demo-out),
#   into one tarball per seed when SEEDS is set (the device tool brings back few files).
set -u
start=$SECONDS
budget=${1:-540}
shift || true
overrides=("$@")
[ ${#overrides[@]} -eq 0 ] && overrides=(full=true)
out=${OUT:-data/gpu-demo-out}
mkdir -p "$out"
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        || exit 1
    export PYTHONPATH=/tmp/site:$PWD
fi
export MUJOCO_GL=${MUJOCO_GL:-egl} PYTHONUNBUFFERED=1 TQDM_MININTERVAL=30
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$out/device.txt"
python3 -c "import torch, platform; print('torch', torch.__version__, torch.cuda.get_device_name(), platform.processor())" \
    | tee -a "$out/device.txt"

# one demo run in $1 (its results to $2), with the overrides after them
run_one() {
    local run=$1 dest=$2
    shift 2
    local resume=false
    [ -f "$run/stages.json" ] && resume=true
    mkdir -p "$dest"
    local left=$((start + budget - SECONDS))
    [ "$left" -lt 1 ] && left=1  # `timeout 0` would mean no limit at all
    timeout -s TERM "$left" python3 -m robo_rl.cli.main demo "$@" demos_from=data/gpu-demos out="$run" \
        device=cuda n_envs=20 videos=0 resume=$resume >>"$dest/demo.log" 2>&1
    for f in stages.json results.json before_after.png; do
        [ -f "$run/$f" ] && cp "$run/$f" "$dest/"
    done
    [ -f "$run/pretrain/metrics.jsonl" ] && cp "$run/pretrain/metrics.jsonl" "$dest/pretrain_metrics.jsonl"
    true
}

if [ -z "${SEEDS:-}" ]; then
    run_one data/gpu-demo "$out" "${overrides[@]}"
    tail -n 40 "$out/demo.log"
    exit 0
fi
for seed in $SEEDS; do
    run_one "data/gpu-demo-s$seed" "/tmp/gpu-demo-out/s$seed" "${overrides[@]}" "seed=$seed" &
    sleep "${STAGGER_S:-0}"
done
wait
for seed in $SEEDS; do
    echo "== seed $seed"
    tail -n 30 "/tmp/gpu-demo-out/s$seed/demo.log"
    tar czf "$out/s$seed.tgz" -C /tmp/gpu-demo-out "s$seed"
done
true
