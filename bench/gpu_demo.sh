#!/usr/bin/env bash
# `robo-rl demo full=true` (200 demos, 30k pre-training steps at batch 256, one RaC round of 120
# rollouts, a 30k-step retrain, 100 evaluation episodes per row) on a lent GPU machine that has
# PyTorch but no package registry.
#
#   bash bench/gpu_demo.sh [SECONDS] [demo overrides ...]      (default overrides: full=true)
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
# - Results, stage timings and the learner's steps/s are copied to $OUT (or ./data/gpu-demo-out).
set -u
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
resume=false
[ -f data/gpu-demo/stages.json ] && resume=true
timeout -s TERM "$budget" python3 -m robo_rl.cli.main demo "${overrides[@]}" demos_from=data/gpu-demos out=data/gpu-demo \
    device=cuda n_envs=20 videos=0 resume=$resume 2>&1 | tee -a "$out/demo.log"
for f in stages.json results.json before_after.png; do
    [ -f "data/gpu-demo/$f" ] && cp "data/gpu-demo/$f" "$out/"
done
[ -f data/gpu-demo/pretrain/metrics.jsonl ] && cp data/gpu-demo/pretrain/metrics.jsonl "$out/pretrain_metrics.jsonl"
true
