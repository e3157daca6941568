#!/usr/bin/env bash
# Camera policies at GPU size, in one call of a lent GPU machine that has
# PyTorch but no package registry:
#
#   bash bench/gpu_cameras.sh [SECONDS]        (default 570: everything ends inside SECONDS)
#
# For each of TransferCube and Insertion:
#   1. 200 scripted demos with three cameras at 96x96 (top, left and right wrist), recorded as
#      SHARDS collect processes in parallel (seeds k*1000 + i) and merged into one store;
#   2. the camera recipe of docs/results.md (conv encoder, MLP, one frame, horizon 64, four noise
#      samples, chunk regression weight 1) at batch 256 on the GPU, both tasks at once, for the
#      minutes left after reserving EVAL_S for evaluation (learner.max_minutes: the cosine ends
#      at the steps that fit);
#   3. 100 evaluation episodes (seeds 100000-100099, the CPU rows' seeds) of the last checkpoint
#      and of the checkpoint nearest half its steps (MID=0: the last only), in EVAL_PARTS CPU
#      processes each. The policy runs as its checkpoint says: the camera recipe's temporal
#      ensembling (the first call, before the recipe had it, ran 8 actions per chunk).
# $OUT (or ./data/gpu-cameras-out) gets device.txt, log.txt, the two runs' metrics and
# results.json (success, 95% Wilson interval, steps and training minutes per checkpoint).
#
# What to carry beside the checkout: `.whl` (cp312 wheels of mujoco, mujoco-core, mujoco-studio,
# websockets, glfw, pyopengl, gymnasium, farama-notifications, hydra-core, omegaconf,
# antlr4-python3-runtime, zarr, donfig, numcodecs, google-crc32c) and `.gl` (the EGL debs of
# the device README); see bench/README.md. Sizes can be shrunk for a check on a CPU:
#   EPISODES=2 SHARDS=2 EVAL_EPISODES=4 EVAL_S=60 bash bench/gpu_cameras.sh 300
set -u
budget=${1:-570}
t0=$(date +%s)
elapsed() { echo $(( $(date +%s) - t0 )); }
EPISODES=${EPISODES:-200}        # demos per task
SHARDS=${SHARDS:-8}              # collect processes per task
EVAL_EPISODES=${EVAL_EPISODES:-100}
EVAL_S=${EVAL_S:-150}            # seconds kept for evaluation
EVAL_PARTS=${EVAL_PARTS:-4}      # evaluation processes per checkpoint
MID=${MID:-1}                    # also evaluate the checkpoint nearest half the steps (0: the last only)
TASKS=${TASKS:-"transfer_cube insertion"}
out=${OUT:-data/gpu-cameras-out}
work=data/gpu-cameras
mkdir -p "$out" "$work"
log="$out/log.txt"
say() { echo "[$(elapsed) s] $*" | tee -a "$log"; }

if ls .gl/*.deb >/dev/null 2>&1; then
    for f in .gl/*.deb; do dpkg -x "$f" /; done
    ldconfig
    vendor=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json
    [ -f $vendor ] && export __EGL_VENDOR_LIBRARY_FILENAMES=$vendor
fi
PY=python3
if [ -x .venv/bin/python ]; then   # a checkout with `make install` done (a CPU check of this script)
    PY=.venv/bin/python
elif ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        || exit 1
    export PYTHONPATH=/tmp/site:$PWD
fi
export MUJOCO_GL=${MUJOCO_GL:-egl} PYTHONUNBUFFERED=1 TQDM_MININTERVAL=30
robo() { $PY -m robo_rl.cli.main "$@"; }
{
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null
    $PY -c "import torch, os; print('torch', torch.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() else 'no cuda', os.cpu_count(), 'cpus')"
    $PY -c "import mujoco; c = mujoco.GLContext(64, 64); c.make_current(); print('mujoco', mujoco.__version__, 'renders with', '$MUJOCO_GL')"
} 2>&1 | tee "$out/device.txt" | tee -a "$log"
say "set-up done"

# 1. demos: SHARDS processes per task, then one merge per task
per=$(( (EPISODES + SHARDS - 1) / SHARDS ))
for task in $TASKS; do
    rm -rf "$work/$task" "$work/$task"-shard* "$work/$task".collect.yaml
    left=$EPISODES
    for k in $(seq 0 $((SHARDS - 1))); do
        n=$(( left < per ? left : per )); left=$(( left - n ))
        [ $n -le 0 ] && continue
        robo collect task=$task episodes=$n seed=$((k * 1000)) "cameras=[top,left_wrist,right_wrist]" \
            "image_size=[96,96]" out=$work/$task-shard$k >"$work/$task-shard$k.log" 2>&1 &
    done
done
wait
for task in $TASKS; do
    ( robo dataset merge $(for d in $work/$task-shard*; do [ -d "$d" ] && echo "$d"; done) out=$work/$task >>"$log" 2>&1 ) &
done
wait
for task in $TASKS; do
    say "$task demos: $(robo dataset info $work/$task json=true 2>/dev/null | $PY -c 'import json,sys; d=json.load(sys.stdin); print(d.get("episodes"), "episodes,", d.get("steps"), "steps")' 2>/dev/null)"
done

# 2. training: both tasks at once on the one GPU, sharing what is left after the evaluation's reserve
train_s=$(( budget - $(elapsed) - EVAL_S - 60 ))   # 60 s: start-up, loading the frames, final checkpoint
[ $train_s -lt 30 ] && train_s=30
minutes=$($PY -c "print(round($train_s / 60, 2))")
say "training both tasks for $minutes min each"
for task in $TASKS; do
    rm -rf "$work/run-$task"
    robo train policy=flow task=$task dataset=$work/$task \
        "obs_keys=[obs/qpos,obs/images/top,obs/images/left_wrist,obs/images/right_wrist]" \
        policy.image_encoder=conv policy.backbone=mlp policy.n_obs=1 policy.horizon=64 +policy.noise_samples=4 \
        +policy.aux_chunk_weight=1.0 learner.batch_size=256 learner.steps=200000 learner.max_minutes=$minutes \
        learner.checkpoint_every=1000 learner.keep_checkpoints=400 eval.episodes=0 \
        run_dir=$work/run-$task >"$work/train-$task.log" 2>&1 &
done
wait
for task in $TASKS; do
    tr '\r' '\n' <"$work/train-$task.log" | grep -v "it/s\]$\|^train:" | tail -4 | tee -a "$log"
    cp "$work/run-$task/metrics.jsonl" "$out/metrics-$task.jsonl" 2>/dev/null
done

# 3. evaluation: the last checkpoint and the one nearest half its steps, EVAL_PARTS processes each
parts=$EVAL_PARTS
per_part=$(( (EVAL_EPISODES + parts - 1) / parts ))
left_s=$(( budget - $(elapsed) - 10 ))
say "evaluating with $left_s s left"
for task in $TASKS; do
    ck=$work/run-$task/checkpoints
    [ -f $ck/last.pt ] || { say "$task: no checkpoint"; continue; }
    mid=""
    [ "$MID" = 1 ] && mid=$($PY - "$ck" <<'EOF'
import sys, pathlib
steps = sorted(int(p.stem.split("_")[1]) for p in pathlib.Path(sys.argv[1]).glob("step_*.pt"))
print(f"step_{min(steps, key=lambda s: abs(s - steps[-1] / 2)):08d}" if len(steps) > 1 else "")
EOF
)
    for name in last $mid; do
        for p in $(seq 0 $((parts - 1))); do
            n=$(( EVAL_EPISODES - p * per_part )); n=$(( n < per_part ? n : per_part ))
            [ $n -le 0 ] && continue
            timeout -s KILL $left_s $PY -m robo_rl.cli.main eval checkpoint=$ck/$name.pt episodes=$n n_envs=$n \
                seed=$((100000 + p * per_part)) videos=0 threads=1 device=cpu out=$work/eval-$task-$name-$p \
                >"$work/eval-$task-$name-$p.log" 2>&1 &
        done
    done
done
wait
$PY - "$work" "$out/results.json" <<'EOF' | tee -a "$log"
import json, math, sys, pathlib, torch
work, dest = pathlib.Path(sys.argv[1]), sys.argv[2]
def wilson(k, n, z=1.96):
    p = k / n; d = 1 + z * z / n; c = p + z * z / (2 * n); h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return (c - h) / d, (c + h) / d
rows = []
for run in sorted(work.glob("run-*")):
    task = run.name[4:]
    log = run / "metrics.jsonl"
    metrics = [json.loads(l) for l in log.read_text().splitlines() if '"loss"' in l] if log.is_file() else []
    for ev in sorted({p.name.rsplit("-", 1)[0] for p in work.glob(f"eval-{task}-*") if p.is_dir()}):
        name = ev[len(f"eval-{task}-"):]
        parts = [json.loads((p / "eval.json").read_text()) for p in work.glob(f"{ev}-*") if (p / "eval.json").is_file()]
        k, n = sum(d["successes"] for d in parts), sum(d["episodes"] for d in parts)
        step = torch.load(run / "checkpoints" / f"{name}.pt", map_location="cpu", weights_only=False)["step"]
        at = [m for m in metrics if m["step"] <= step]
        row = {"task": task, "checkpoint": name, "step": step, "train_min": round(at[-1]["time_s"] / 60, 2) if at else None,
               "steps_per_s": round(metrics[-1]["steps_per_s"], 1) if metrics else None, "episodes": n, "successes": k}
        if n:
            lo, hi = wilson(k, n)
            row.update(success=k / n, ci95=[round(lo, 3), round(hi, 3)],
                       stage_reach={s: round(sum(d["stage_reach"][s] * d["episodes"] for d in parts) / n, 3)
                                    for s in parts[0]["stage_reach"]})
        rows.append(row)
        print(json.dumps(row))
json.dump(rows, open(dest, "w"), indent=1)
EOF
say "done"
