"""Why a camera policy fails in closed loop: the measurements behind the table of docs/history.md's
"Why camera policies fail in closed loop: the diagnosis". Each part prints a table with its
reference in the same run:

- `probe`: per camera, how well the cube's position and yaw can be read from one frame. A fresh
  encoder (the policy's own conv encoder, same crop) is trained to regress them on the demos'
  frames before the grasp (the cube still at its start pose), and scored on held-out episodes,
  against the reference of guessing the training mean. With `--checkpoint`, the trained
  policy's own frozen camera features get a ridge-regression probe too: what the action loss
  taught the encoder to see. The targets are privileged (object pose); a probe is a measurement,
  never a policy input.
- `openloop`: a trained policy's chunks on its training windows, by where the window starts in
  the episode, against the demos' actions; beside each, how far the chunk moves when the frames
  are swapped for another episode's frames at the same step (the cube elsewhere), against how far
  the two demos' own actions differ there. A policy that reads its joints instead of the image
  ("copycat") moves little when the image is swapped.
- `position`: an eval.json's episodes binned by the cube's start distance from its mean pose.
- `align` (Insertion): per camera, how well a fresh encoder reads the peg's alignment with the
  socket's bore (across it, along it, tilt) from one frame, near the mouth and inside the bore.
- `stuck` (Insertion): where recorded rollouts leave the peg (depth, off-axis, tilt), against the demos.
- `reach` (Insertion): per camera, how well a fresh encoder reads where the right hand is along
  the peg and across it, from one frame of the approach before the gripper closes.
- `aim` (Insertion): where the right hand is when its gripper closes, against where the expert grips
  the peg, as a function of the peg's start offset from the demos' mean: how much of the peg's
  offset, in x and in y, the aim follows (1: all of it, as the expert; 0: it aims at the mean);
  with `--checkpoint`, what the policy's own frozen camera features say of the peg's x and y.
- `grip` (Insertion): how far from the peg's tip the right hand holds it once both parts are
  lifted, rollouts grouped by outcome; and, as the reference, the scripted expert's own success
  when told to grip the peg at each such distance (`collect grasp_along=`).
- `handover` (TransferCube): when recorded rollouts close the left gripper and open the right one,
  and where the cube ends, against the demos.
- `shifts` (any task; a camera policy): the demos replayed in shifted rooms (robo_rl/sim/room.py),
  frame by frame through the policy: which camera's features each shift moves, and how far that
  moves the actions, with every camera shifted and with one at a time. `--dataset` may also be the
  policy's own rollouts (`robo-rl eval ... record=PATH`): the states it reaches itself; `--stages
  1 2` keeps only the states in those task stages (TransferCube's hand-over).
- `parting` (any task; a camera policy): the same seeds rolled out in the nominal room and in a
  shifted one (`robo-rl eval ... shifts=[...] record=DIR`: DIR/nominal and DIR/<shift>). The
  physics and the starting noise are the same, so the two runs move alike until the frames move
  the actions: where their joint paths part, in which task stage, and where each run ends, pairs
  grouped by which of the two succeeded.
- `latch` (PackCube, either variant; any policy): after the cube is in the box, where the right
  hand goes relative to the latch button and how deep the button goes, rollouts that latched
  (the reference, in the same store) against those that ran out of time with the cube in the box,
  and why those did not latch (with `--eval EVAL_JSON`, split by whether the cube slipped).

    python bench/camera_diagnosis.py probe --dataset data/demos/tc_cams [--checkpoint RUN/checkpoints/last.pt]
    python bench/camera_diagnosis.py openloop --dataset data/demos/tc_cams --checkpoint RUN/checkpoints/last.pt
    python bench/camera_diagnosis.py position --eval RUN/eval-last/eval.json
    python bench/camera_diagnosis.py align --dataset data/demos/insertion_cams
    python bench/camera_diagnosis.py stuck --dataset data/demos/insertion_cams --rollouts ROLLOUTS
    python bench/camera_diagnosis.py reach --dataset data/demos/insertion_cams
    python bench/camera_diagnosis.py aim --dataset data/demos/insertion_cams --rollouts ROLLOUTS [--checkpoint RUN/checkpoints/last.pt]
    python bench/camera_diagnosis.py grip --rollouts ROLLOUTS [--grips 8 9 10 12]
    python bench/camera_diagnosis.py handover --dataset data/demos/transfer_cube_cams --rollouts ROLLOUTS
    python bench/camera_diagnosis.py shifts --dataset data/demos/tc_cams --checkpoint RUN/checkpoints/last.pt
    python bench/camera_diagnosis.py parting --rollouts DIR/nominal --shifted DIR/light_1.5
    python bench/camera_diagnosis.py latch --rollouts ROLLOUTS [--eval OUT/eval.json]  # robo-rl eval ... record=ROLLOUTS out=OUT
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import cpu_kind, make_console, table  # noqa: E402

from robo_rl.data.store import EpisodeStore  # noqa: E402
from robo_rl.sim.tasks.insertion import Insertion  # noqa: E402

TRAIN_EPISODES = 40  # the rest of a 50-episode store is held out for the probes


def show(title: str, columns: list[str], rows: list[tuple]) -> None:
    t = table(title, columns)
    for row in rows:
        t.add_row(*(str(v) for v in row))
    make_console().print(t)


def cube_pose(env_state: np.ndarray) -> np.ndarray:
    """(x, y, yaw) of the cube from TransferCube's env_state (x, y, z, qw, qx, qy, qz)."""
    w, x, y, z = env_state[..., 3], env_state[..., 4], env_state[..., 5], env_state[..., 6]
    yaw = np.arctan2(2 * (w * z + x * y), 1 - 2 * (y * y + z * z))
    return np.stack([env_state[..., 0], env_state[..., 1], yaw], -1).astype(np.float32)


def resting_steps(store: EpisodeStore, state: np.ndarray, episodes: range) -> tuple[np.ndarray, np.ndarray]:
    """Global step indices (and their step in the episode) where the cube still rests at its start
    pose (moved < 2 mm): its pose is what the grasp must be aimed at. `state`: the store's env_state."""
    idx, t = [], []
    for e in episodes:
        s, end = store.episode_range(e)
        moved = np.linalg.norm(state[s:end, :3] - state[s, :3], axis=1)
        still = np.flatnonzero(np.cumsum(moved > 0.002) == 0)
        idx.append(s + still), t.append(still)
    return np.concatenate(idx), np.concatenate(t)


def probe_errors(pred: np.ndarray, target: np.ndarray) -> tuple[float, float]:
    """(median xy error in cm, median |yaw error| in degrees)."""
    xy = np.linalg.norm(pred[:, :2] - target[:, :2], axis=1) * 100
    yaw = np.abs(pred[:, 2] - target[:, 2]) * 180 / math.pi
    return float(np.median(xy)), float(np.median(yaw))


def fmt(errors: tuple[float, float]) -> tuple[str, str]:
    return f"{errors[0]:.2f}", f"{errors[1]:.1f}"


def train_probe(frames: np.ndarray, targets: np.ndarray, test_frames: np.ndarray, steps: int, batch: int,
                crop_ratio: float, bf16: bool, seed: int) -> np.ndarray:
    """A fresh conv encoder + linear head regressing the targets, normalised; predictions on test_frames."""
    from robo_rl.policies.nets.encoders import CameraEncoder

    torch.manual_seed(seed)
    mean, std = targets.mean(0), targets.std(0) + 1e-6
    y = torch.as_tensor((targets - mean) / std)
    x = torch.as_tensor(frames)
    enc = CameraEncoder(tuple(frames.shape[1:3]), 64, 32, crop_ratio, kind="conv")
    model = torch.nn.Sequential(enc, torch.nn.Mish(), torch.nn.Linear(64, targets.shape[1]))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=1e-6)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, 1e-3, total_steps=steps, pct_start=0.1)
    gen = torch.Generator().manual_seed(seed)
    model.train()
    for _ in range(steps):
        i = torch.randint(0, len(x), (batch,), generator=gen)
        with torch.autocast("cpu", torch.bfloat16, enabled=bf16):
            loss = (model(x[i]).float() - y[i]).pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
    model.eval()
    with torch.no_grad():
        out = torch.cat([model(torch.as_tensor(test_frames[j:j + 256])) for j in range(0, len(test_frames), 256)])
    return out.numpy() * std + mean


def policy_features(policy, key: str, frames: np.ndarray) -> np.ndarray:
    enc = policy.body.encoder.cameras[key.replace("/", "__")]
    with torch.no_grad():
        return torch.cat([enc(torch.as_tensor(frames[j:j + 256])) for j in range(0, len(frames), 256)]).float().numpy()


def ridge(train_x: np.ndarray, train_y: np.ndarray, test_x: np.ndarray, lam: float = 1e-3) -> np.ndarray:
    mu, sd = train_x.mean(0), train_x.std(0) + 1e-6
    a = np.c_[(train_x - mu) / sd, np.ones(len(train_x))]
    w = np.linalg.solve(a.T @ a + lam * len(a) * np.eye(a.shape[1]), a.T @ train_y)
    return np.c_[(test_x - mu) / sd, np.ones(len(test_x))] @ w


def probe_inputs(args) -> tuple[EpisodeStore, list[str], int, np.ndarray]:
    """A probe's demos: the store, the cameras to probe, its episode count and its env_state."""
    store = EpisodeStore.open(args.dataset, mode="r")
    n = store.n_episodes
    if n <= TRAIN_EPISODES:
        raise SystemExit(f"{args.dataset}: probes need more than {TRAIN_EPISODES} episodes (it has {n})")
    return store, args.cameras or list(store.schema.image_keys), n, np.asarray(store.read("obs/env_state"))


def run_probe(args) -> None:
    store, cams, n, state = probe_inputs(args)
    tr, _ = resting_steps(store, state, range(TRAIN_EPISODES))
    te, te_t = resting_steps(store, state, range(TRAIN_EPISODES, n))
    pose = cube_pose(state)
    ytr, yte = pose[tr], pose[te]
    start = te_t < 10  # the first 10 steps: the arms still at home, what the first chunk is chosen from
    guess = np.broadcast_to(ytr.mean(0), yte.shape)
    rows = [("(reference) the training mean", "-", *fmt(probe_errors(guess, yte)), *fmt(probe_errors(guess[start], yte[start])), "-")]
    policy = None
    if args.checkpoint:
        from robo_rl.policies import load_policy

        policy = load_policy(args.checkpoint)
    torch.set_num_threads(args.threads)
    feats_tr, feats_te = [], []
    for key in cams:
        frames = np.asarray(store.read(key))
        t0 = time.perf_counter()
        if args.steps <= 0:  # --steps 0: only the trained policy's features
            pred = None
        else:
            pred = train_probe(frames[tr], ytr, frames[te], args.steps, args.batch, args.crop_ratio, args.bf16, args.seed)
        if pred is not None:
            rows.append((f"{key} {frames.shape[1]}x{frames.shape[2]}", "fresh conv encoder", *fmt(probe_errors(pred, yte)),
                         *fmt(probe_errors(pred[start], yte[start])), f"{time.perf_counter() - t0:.0f}"))
        if policy is not None and key in policy.shapes.images:
            f_tr, f_te = policy_features(policy, key, frames[tr]), policy_features(policy, key, frames[te])
            feats_tr.append(f_tr), feats_te.append(f_te)
            pred = ridge(f_tr, ytr, f_te)
            rows.append((f"{key}", "trained policy's features (ridge)", *fmt(probe_errors(pred, yte)),
                         *fmt(probe_errors(pred[start], yte[start])), "-"))
    if len(feats_tr) > 1:
        pred = ridge(np.concatenate(feats_tr, 1), ytr, np.concatenate(feats_te, 1))
        rows.append(("all its cameras", "trained policy's features (ridge)", *fmt(probe_errors(pred, yte)),
                     *fmt(probe_errors(pred[start], yte[start])), "-"))
    show(f"cube pose probes, {args.dataset} (train episodes 0-{TRAIN_EPISODES - 1}, held out {TRAIN_EPISODES}-{n - 1}; "
          f"{args.steps} steps at batch {args.batch}; {cpu_kind()})",
          ["camera", "probe", "xy cm (median)", "yaw deg", "xy cm, first 10 steps", "yaw deg, first 10 steps", "s"], rows)


# Insertion: the peg must meet the socket's bore (0.6 cm of clearance a side) along its axis
PEG_HALF_LEN, SOCKET_HALF_LEN, GRIP_BEHIND_CENTRE = Insertion.peg_half_len, Insertion.socket_half_len, Insertion.grip_behind_centre


def rotation(quat: np.ndarray) -> np.ndarray:
    """(n, 3, 3) rotation matrices from (n, 4) unit quaternions as MuJoCo stores them (w, x, y, z)."""
    from scipy.spatial.transform import Rotation

    return Rotation.from_quat(np.asarray(quat, dtype=np.float64)[..., [1, 2, 3, 0]]).as_matrix()


def both_lifted(state: np.ndarray) -> np.ndarray:
    """Per step of Insertion's env_state: both parts in the air (z > 5 cm, the task's `both_lifted`)."""
    return (state[:, 2] > 0.05) & (state[:, 9] > 0.05)


def outcome(store: EpisodeStore, e: int, reference: bool) -> str:
    """The group an episode's row falls in: the reference demos all together, rollouts by success."""
    return "all" if reference else ("succeeded" if store.meta(e).success else "failed")


def peg_in_socket_frame(env_state: np.ndarray) -> np.ndarray:
    """Insertion's alignment, what the last step must read: the peg's tip in the socket's frame
    (x along the bore, the mouth at +3.5 cm; y, z across it) and the peg's axis across the bore
    (its y, z components in the socket's frame: the tilt, about its sine), from env_state
    (peg x, y, z, qw, qx, qy, qz, then the socket's)."""
    peg_rot, sock_rot = rotation(env_state[:, 3:7]), rotation(env_state[:, 10:14])
    tip = env_state[:, :3] - PEG_HALF_LEN * peg_rot[:, :, 0]  # the peg's -x end goes in first
    local_tip = np.einsum("nji,nj->ni", sock_rot, tip - env_state[:, 7:10])
    local_axis = np.einsum("nji,nj->ni", sock_rot, peg_rot[:, :, 0])
    return np.c_[local_tip, local_axis[:, 1:]].astype(np.float32)


def alignment_errors(pred: np.ndarray, target: np.ndarray) -> tuple[float, float, float]:
    """(median error across the bore in cm, along it in cm, of the tilt in degrees)."""
    across = np.linalg.norm(pred[:, 1:3] - target[:, 1:3], axis=1) * 100
    along = np.abs(pred[:, 0] - target[:, 0]) * 100
    tilt = np.degrees(np.arcsin(np.clip(np.linalg.norm(pred[:, 3:5] - target[:, 3:5], axis=1), 0, 1)))
    return float(np.median(across)), float(np.median(along)), float(np.median(tilt))


def lifted_steps(store: EpisodeStore, state: np.ndarray, episodes: range) -> np.ndarray:
    """Global step indices where both parts are in the air: the hands are bringing the peg to the
    bore or pushing it in."""
    lifted = both_lifted(state)
    return np.concatenate([s + np.flatnonzero(lifted[s:end]) for s, end in map(store.episode_range, episodes)])


def fresh_probe_rows(args, store: EpisodeStore, cams: list[str], tr: np.ndarray, te: np.ndarray, ytr: np.ndarray,
                     cells, guess: np.ndarray) -> list[tuple]:
    """The reference row (`guess`), then a row per camera: a fresh conv encoder trained on the frames
    of steps `tr` to regress `ytr`, its predictions on steps `te` scored by `cells`, and its seconds."""
    rows = [("(reference) the training mean", *cells(guess), "-")]
    torch.set_num_threads(args.threads)
    for key in cams:
        frames = np.asarray(store.read(key))
        t0 = time.perf_counter()
        pred = train_probe(frames[tr], ytr, frames[te], args.steps, args.batch, args.crop_ratio, args.bf16, args.seed)
        rows.append((f"{key} {frames.shape[1]}x{frames.shape[2]}", *cells(pred), f"{time.perf_counter() - t0:.0f}"))
    return rows


def run_align_probe(args) -> None:
    """Per camera, how well a fresh encoder reads the peg's alignment with the socket from one frame,
    on held-out episodes: in the last 5 cm before the tip enters the bore, and once it is in."""
    store, cams, n, state = probe_inputs(args)
    if state.shape[1] != 14:
        raise SystemExit(f"{args.dataset}: obs/env_state has {state.shape[1]} values, not Insertion's 14 (peg, socket)")
    tr, te = lifted_steps(store, state, range(TRAIN_EPISODES)), lifted_steps(store, state, range(TRAIN_EPISODES, n))
    target = peg_in_socket_frame(state)
    ytr, yte = target[tr], target[te]
    inside = yte[:, 0] < SOCKET_HALF_LEN  # the tip past the mouth
    at_mouth = ~inside & (yte[:, 0] < SOCKET_HALF_LEN + 0.05)  # the last 5 cm of the approach
    guess = np.broadcast_to(ytr.mean(0), yte.shape)

    def cells(pred: np.ndarray) -> tuple[str, ...]:
        return tuple(f"{v:.2f}" if i < 2 else f"{v:.1f}" for part in (at_mouth, inside)
                     for i, v in enumerate(alignment_errors(pred[part], yte[part])))

    rows = fresh_probe_rows(args, store, cams, tr, te, ytr, cells, guess)
    show(f"peg-in-socket alignment probes, {args.dataset} (fresh conv encoder per camera; train episodes "
         f"0-{TRAIN_EPISODES - 1}, held out {TRAIN_EPISODES}-{n - 1}: {int(at_mouth.sum())} steps within 5 cm of the mouth, "
         f"{int(inside.sum())} in it; {args.steps} steps at batch {args.batch}; {cpu_kind()})",
         ["camera", "across cm, at mouth", "along cm, at mouth", "tilt deg, at mouth", "across cm, in bore",
          "along cm, in bore", "tilt deg, in bore", "s"], rows)


def grip_from_tip(robot, site: int, state: np.ndarray, qpos: np.ndarray) -> float:
    """cm from the peg's tip to the right hand's grip point, measured along the peg's axis."""
    robot.set_joint_positions(qpos)
    hand_in_peg = rotation(state[3:7][None])[0].T @ (robot.data.site_xpos[site] - state[:3])
    return float(hand_in_peg[0] + PEG_HALF_LEN) * 100


def run_stuck(args) -> None:
    """Where Insertion's rollouts stop, from their recorded env_state, joints and commands: how deep
    the peg's tip got (the pin is at -2.8 cm in the socket's frame, the mouth at +3.5), how far off
    the bore's axis and how tilted the peg was there, where the right hand holds the peg (its
    distance from the tip), and whether the arm was pushing against something there (the largest
    gap between the right arm's commanded and actual joints); the demos of `--dataset` as the reference."""
    from robo_rl.sim.expert import arm_slice
    from robo_rl.sim.robot import SimRobot

    robot = SimRobot("insertion.xml", cameras=[])
    site, arm = robot.model.site("right_ee").id, arm_slice(robot.spec, "right")
    rows = []
    for name, path in (("demos (the expert)", args.dataset), ("rollouts", args.rollouts)):
        store = EpisodeStore.open(path, mode="r")
        state, qpos, act = (np.asarray(store.read(k)) for k in ("obs/env_state", "obs/qpos", "action"))
        target = peg_in_socket_frame(state)
        facts: dict[str, list] = {}
        for e in range(store.n_episodes):
            s, end = store.episode_range(e)
            deepest = s + int(np.argmin(target[s:end, 0]))
            x, y, z, ay, az = target[deepest]
            grip = grip_from_tip(robot, site, state[deepest], qpos[deepest])
            pushing = float(np.abs(act[deepest, arm] - qpos[deepest, arm]).max())
            lifted = bool(both_lifted(state[s:end]).any())
            facts.setdefault(outcome(store, e, path == args.dataset), []).append((x * 100, math.hypot(y, z) * 100, math.degrees(math.asin(min(1.0, math.hypot(ay, az)))),
                                                x < SOCKET_HALF_LEN, end - deepest, lifted, grip, pushing))
        for group, f in facts.items():
            a = np.array(f, dtype=float)
            rows.append((f"{name}, {group}", len(a), f"{a[:, 5].mean():.0%}", f"{a[:, 3].mean():.0%}", f"{np.median(a[:, 0]):.1f}",
                         f"{np.median(a[:, 1]):.2f}", f"{np.median(a[:, 2]):.1f}", f"{np.median(a[:, 4]):.0f}",
                         f"{np.median(a[:, 6]):.1f} [{a[:, 6].min():.1f}, {a[:, 6].max():.1f}]", f"{np.median(a[:, 7]):.3f}"))
    show(f"where the peg's tip got to, in the socket's frame (medians; the pin at -2.8 cm, the mouth at +3.5 cm; {cpu_kind()})",
         ["episodes", "n", "both parts lifted", "tip entered the bore", "deepest tip x (cm)", "off the axis there (cm)",
          "tilt there (deg)", "steps after it", "hand from the tip (cm) [min, max]", "command - joints (rad)"], rows)


def run_reach_probe(args) -> None:
    """Per camera, how well a fresh encoder reads the right hand's position in the peg's frame (along
    its axis, across it) from one frame, over the demos' steps before the right gripper closes, and
    over the last 20 of them (the hand within a few cm of where it grips). A camera that sees only
    part of a long bar can read across it, not along it."""
    from robo_rl.sim.expert import grip_index
    from robo_rl.sim.robot import SimRobot

    store, cams, n, state = probe_inputs(args)
    robot = SimRobot("insertion.xml", cameras=[])
    site, grip = robot.model.site("right_ee").id, grip_index(robot.spec, "right")
    qpos, act = np.asarray(store.read("obs/qpos")), np.asarray(store.read("action"))
    steps, last = [], []
    for e in range(n):
        s, end = store.episode_range(e)
        closes = s + int(np.flatnonzero(act[s:end, grip] < 0.5)[0])
        steps.append(np.arange(s, closes))
        last.append(np.arange(s, closes) >= closes - 20)
    target = np.zeros((len(state), 2), np.float32)
    for t in np.concatenate(steps):
        robot.set_joint_positions(qpos[t])
        target[t] = (rotation(state[t, 3:7][None])[0].T @ (robot.data.site_xpos[site] - state[t, :3]))[:2]
    tr, te = np.concatenate(steps[:TRAIN_EPISODES]), np.concatenate(steps[TRAIN_EPISODES:])
    near = np.concatenate(last[TRAIN_EPISODES:])
    ytr, yte = target[tr], target[te]

    def cells(pred: np.ndarray) -> tuple[str, ...]:
        err = np.abs(pred - yte) * 100
        return tuple(f"{np.median(err[part, i]):.2f}" for part in (slice(None), near) for i in (0, 1))

    rows = fresh_probe_rows(args, store, cams, tr, te, ytr, cells, np.broadcast_to(ytr.mean(0), yte.shape))
    show(f"where the right hand is on the peg before it grips, probes, {args.dataset} (fresh conv encoder per camera; "
         f"train episodes 0-{TRAIN_EPISODES - 1}, held out {TRAIN_EPISODES}-{n - 1}: {len(te)} steps, {int(near.sum())} "
         f"in the last 20 before the close; {args.steps} steps at batch {args.batch}; {cpu_kind()})",
         ["camera", "along cm", "across cm", "along cm, last 20", "across cm, last 20", "s"], rows)


def run_aim(args) -> None:
    """Insertion's grasp aim, from recorded env_state, joints and commands: at the first step the right
    gripper's command closes, the hand's xy offset from the expert's grip point (3 cm behind the peg's
    centre along its axis), fitted as a linear function of the peg's start offset from the demos' mean
    start. The slope per axis, plus one, is the share of the peg's offset the aim follows."""
    from robo_rl.sim.expert import grip_index
    from robo_rl.sim.robot import SimRobot

    robot = SimRobot("insertion.xml", cameras=[])
    site, grip = robot.model.site("right_ee").id, grip_index(robot.spec, "right")
    demos = EpisodeStore.open(args.dataset, mode="r")
    demo_state = np.asarray(demos.read("obs/env_state"))
    mean_start = np.mean([demo_state[demos.episode_range(e)[0], :2] for e in range(demos.n_episodes)], axis=0)
    rows = []
    for name, path in (("demos (the expert)", args.dataset), ("rollouts", args.rollouts)):
        store = EpisodeStore.open(path, mode="r")
        state, qpos, act = (np.asarray(store.read(k)) for k in ("obs/env_state", "obs/qpos", "action"))
        offsets, errors, never = [], [], 0
        for e in range(store.n_episodes):
            s, end = store.episode_range(e)
            closes = np.flatnonzero(act[s:end, grip] < 0.5)
            if not len(closes):
                never += 1
                continue
            t = s + int(closes[0])
            robot.set_joint_positions(qpos[t])
            axis = rotation(state[t, 3:7][None])[0][:2, 0]
            errors.append(robot.data.site_xpos[site][:2] - (state[t, :2] + GRIP_BEHIND_CENTRE * axis))
            offsets.append(state[s, :2] - mean_start)
        d, err = np.array(offsets), np.array(errors)
        slope, *_ = np.linalg.lstsq(np.c_[d, np.ones(len(d))], err, rcond=None)
        rows.append((name, len(d), never, f"{d[:, 0].std() * 100:.1f} / {d[:, 1].std() * 100:.1f}",
                     f"{np.median(np.abs(err[:, 0])) * 100:.1f} / {np.median(np.abs(err[:, 1])) * 100:.1f}",
                     f"{1 + slope[0, 0]:.2f} / {1 + slope[1, 1]:.2f}"))
    show(f"where the right hand closes on the peg, against the expert's grip point (x / y; {cpu_kind()})",
         ["episodes", "closed", "never closed", "peg start offset std (cm)", "aim error, median |.| (cm)",
          "share of the peg's offset the aim follows"], rows)
    aim_in_the_loss(demos, demo_state, robot, grip, mean_start)
    if args.checkpoint:
        features_probe(args, demos, demo_state)


def aim_in_the_loss(demos: EpisodeStore, state: np.ndarray, robot, grip: int, mean_start: np.ndarray) -> None:
    """How big the aim is in what the policy is trained on: per cm of the peg's start offset in x and
    in y, how far the demos' right-arm command at the close moves in the policy's normalised action
    units (min-max over the demos, to [-1, 1]); and each axis's share of that variance over the demos."""
    from robo_rl.sim.expert import arm_slice

    act = np.asarray(demos.read("action"))
    lo, hi = act.min(0), act.max(0)
    arm = arm_slice(robot.spec, "right")
    at_close, offsets = [], []
    for e in range(demos.n_episodes):
        s, end = demos.episode_range(e)
        t = s + int(np.flatnonzero(act[s:end, grip] < 0.5)[0])
        at_close.append((2 * (act[t] - lo) / np.maximum(hi - lo, 1e-9) - 1)[arm])
        offsets.append((state[s, :2] - mean_start) * 100)
    d = np.array(offsets)
    per_cm, *_ = np.linalg.lstsq(np.c_[d, np.ones(len(d))], np.array(at_close), rcond=None)
    names = robot.spec.joint_names[arm]
    rows = [(n, f"{per_cm[0, j]:+.3f}", f"{per_cm[1, j]:+.3f}", f"{hi[arm][j] - lo[arm][j]:.2f}") for j, n in enumerate(names)]
    share = [(np.linalg.norm(per_cm[i]) * d[:, i].std()) ** 2 for i in (0, 1)]
    rows.append(("all six (norm)", f"{np.linalg.norm(per_cm[0]):.3f}", f"{np.linalg.norm(per_cm[1]):.3f}",
                 f"x's variance / y's: {share[0] / share[1]:.2f}"))
    show("the aim in the loss: the demos' right-arm command at the close, per cm of the peg's start offset (normalised units)",
         ["joint", "per cm of x", "per cm of y", "the joint's demo range (rad)"], rows)


def features_probe(args, demos: EpisodeStore, state: np.ndarray) -> None:
    """What the trained policy's own (frozen) camera features say of the peg's x and y while it rests
    at its start pose: a linear (ridge) probe per camera and over all of them, on held-out demos."""
    from robo_rl.policies import load_policy

    policy = load_policy(args.checkpoint)
    tr, _ = resting_steps(demos, state, range(TRAIN_EPISODES))
    te, te_t = resting_steps(demos, state, range(TRAIN_EPISODES, demos.n_episodes))
    ytr, yte, start = state[tr, :2], state[te, :2], te_t < 10

    def cells(pred: np.ndarray) -> tuple[str, ...]:
        err = np.abs(pred - yte) * 100
        return tuple(f"{np.median(err[part, i]):.2f}" for part in (slice(None), start) for i in (0, 1))

    rows, feats_tr, feats_te = [("(reference) the training mean", *cells(np.broadcast_to(ytr.mean(0), yte.shape)))], [], []
    for key in policy.shapes.images:
        frames = np.asarray(demos.read(key))
        feats_tr.append(policy_features(policy, key, frames[tr]))
        feats_te.append(policy_features(policy, key, frames[te]))
        rows.append((key, *cells(ridge(feats_tr[-1], ytr, feats_te[-1]))))
    rows.append(("all its cameras", *cells(ridge(np.concatenate(feats_tr, 1), ytr, np.concatenate(feats_te, 1)))))
    show(f"the peg's start x and y from {args.checkpoint}'s frozen camera features (ridge; median |error| cm on "
         f"held-out demos {TRAIN_EPISODES}-{demos.n_episodes - 1}, the peg at rest)",
         ["features", "x", "y", "x, first 10 steps", "y, first 10 steps"], rows)


def run_grip(args) -> None:
    """Insertion's grip along the peg: where the policy's rollouts hold it (at the first step both
    parts are in the air), and what the scripted expert makes of a grip at each distance from the
    tip (its usual one is 10 cm): a reach the expert cannot finish is out of any demo's range."""
    from robo_rl.sim.expert import ExpertNoise
    from robo_rl.sim.recording import expert_episode, recording_env
    from robo_rl.sim.robot import SimRobot

    t0, (env, _), rows = time.perf_counter(), recording_env("insertion"), []
    for cm in args.grips:
        shift = cm / 100 - (PEG_HALF_LEN + GRIP_BEHIND_CENTRE)  # from the expert's usual grip
        seeds = range(args.seed + 1000, args.seed + 1000 + args.expert_episodes)  # not the demos' seeds
        wins = sum(expert_episode(env, seed, ExpertNoise(grasp_along=(shift, shift)))[1] for seed in seeds)
        rows.append((f"{cm:g}", f"{wins}/{args.expert_episodes}"))
    env.close()
    show(f"the scripted expert, told to grip the peg this far from its tip ({args.expert_episodes} seeds each, "
         f"{time.perf_counter() - t0:.0f} s; {cpu_kind()})", ["grip from the tip (cm)", "expert succeeds"], rows)
    if not args.rollouts:
        return
    robot = SimRobot("insertion.xml", cameras=[])
    site, bins = robot.model.site("right_ee").id, [(0, 9), (9, 13), (13, 99)]
    store = EpisodeStore.open(args.rollouts, mode="r")
    state, qpos = (np.asarray(store.read(k)) for k in ("obs/env_state", "obs/qpos"))
    groups: dict[str, list[float | None]] = {}
    for e in range(store.n_episodes):
        s, end = store.episode_range(e)
        lifted = np.flatnonzero(both_lifted(state[s:end]))
        grip = grip_from_tip(robot, site, state[s + lifted[0]], qpos[s + lifted[0]]) if len(lifted) else None
        groups.setdefault(outcome(store, e, False), []).append(grip)
    rows = []
    for group, grips in sorted(groups.items()):
        held = np.array([g for g in grips if g is not None])
        rows.append((group, len(grips), *(int(((held >= lo) & (held < hi)).sum()) for lo, hi in bins),
                     len(grips) - len(held), f"{np.median(held):.1f} [{held.min():.1f}, {held.max():.1f}]" if len(held) else "-"))
    show(f"{args.rollouts}: where the right hand holds the peg once both parts are lifted (cm from its tip)",
         ["episodes", "n", "under 9 cm", "9 to 13 cm", "13 cm or more", "never lifted", "median [min, max]"], rows)


def run_handover(args) -> None:
    """TransferCube's handover, from recorded actions and env_state: when the left gripper's command
    closes, how long after it the right one's opens (the task succeeds once the left holds the cube
    above 8 cm and the right no longer touches it), and where the cube ends; the demos of
    `--dataset` as the reference."""
    from robo_rl.sim.expert import grip_index
    from robo_rl.sim.robot import SimRobot

    spec = SimRobot("transfer_cube.xml", cameras=[]).spec
    right, left = grip_index(spec, "right"), grip_index(spec, "left")
    rows = []
    for name, path in (("demos (the expert)", args.dataset), ("rollouts", args.rollouts)):
        store = EpisodeStore.open(path, mode="r")
        act, state = np.asarray(store.read("action")), np.asarray(store.read("obs/env_state"))
        facts: dict[str, list] = {}
        for e in range(store.n_episodes):
            s, end = store.episode_range(e)
            r, lg = act[s:end, right], act[s:end, left]
            left_closes = np.flatnonzero(lg < 0.5)
            right_closed = np.flatnonzero(r < 0.1)
            # the expert ramps its grippers: the release has begun once the closed command rises past 0.2
            opens = np.flatnonzero(r[right_closed[0]:] > 0.2) + right_closed[0] if len(right_closed) else np.array([])
            gap = (opens[0] - left_closes[0]) if len(left_closes) and len(opens) else np.nan
            facts.setdefault(outcome(store, e, path == args.dataset), []).append((left_closes[0] if len(left_closes) else np.nan, gap, float(len(opens) > 0),
                                                r[-1], lg[-1], state[end - 1, 2] * 100, end - s))
        for group, f in facts.items():
            a = np.array(f, dtype=float)
            rows.append((f"{name}, {group}", len(a), f"{np.nanmedian(a[:, 0]):.0f}", f"{np.nanmedian(a[:, 1]):.0f}",
                         f"{a[:, 2].mean():.0%}", f"{np.median(a[:, 3]):.2f}", f"{np.median(a[:, 4]):.2f}",
                         f"{np.median(a[:, 5]):.1f}", f"{np.median(a[:, 6]):.0f}"))
    show(f"TransferCube's handover (medians; gripper commands: 1 open, 0 closed; {cpu_kind()})",
         ["episodes", "n", "left closes (< 0.5) at step", "right opens (> 0.2), steps later", "right ever opens", "right's last command",
          "left's last command", "cube z at the end (cm)", "length"], rows)


def run_latch(args) -> None:
    """PackCube's last sub-task, from recorded rollouts (robo-rl eval record=): for every episode that
    put the cube in the box, from that step on, how close the right hand's end effector came to the
    latch button (horizontally), how low it got over the button's top while within 2 cm of it, how
    deep the button went (it latches past `latch_q`), and how long it took. The button stands on the
    table (its depth is env_state's last value), the hand comes from the recorded joints."""
    import mujoco

    from robo_rl.sim.envs import BimanualEnv
    from robo_rl.sim.expert import grip_index

    store = EpisodeStore.open(args.rollouts, mode="r")
    task_name = store.meta(0).task
    env = BimanualEnv(task_name, obs_mode="state")
    robot, task = env.robot, env.task
    in_box, latched = task.stage_names.index("cube_in_box"), task.stage_names.index("latched")
    site = robot.model.site("right_ee").id
    stage, state, qpos, action = (np.asarray(store.read(k)) for k in ("stage", "obs/env_state", "obs/qpos", "action"))
    grip = grip_index(robot.spec, "right")  # the right gripper's command (0 closed .. 1 open)
    slipped = {}  # seed -> the cube slipped in that episode, from the evaluation's eval.json (--eval)
    if args.eval:
        slipped = {int(e["seed"]): bool(e["disturbed"]) for e in json.loads(Path(args.eval).read_text())["per_episode"]}
    why: dict[str, list[int]] = {}  # the episodes that did not latch, by what the hand did: [clean, slipped]
    facts: dict[str, list] = {}
    for e in range(store.n_episodes):
        s, end = store.episode_range(e)
        reached = np.flatnonzero(stage[s:end] >= in_box)
        if not len(reached):
            continue  # the cube never got into the box: not the latch's failure
        t0 = s + int(reached[0])
        dist, height, press = [], [], []
        for t in range(t0, end):
            robot.data.joint("button").qpos[0] = state[t, -1]
            robot.set_joint_positions(qpos[t])
            mujoco.mj_kinematics(robot.model, robot.data)
            hand, button = robot.data.site_xpos[site], robot.data.body("button").xpos
            dist.append(float(np.linalg.norm(hand[:2] - button[:2])))
            height.append(float(hand[2] - button[2]))
            press.append(float(state[t, -1]))
        dist, height = np.array(dist) * 100, np.array(height) * 100
        near = dist < 2.0
        group = "latched" if stage[end - 1] >= latched else "cube in the box, not latched"
        if group != "latched":
            # opening wide (the demos' grip before a grasp) over a placed cube: the policy goes back to grasping it
            if (state[t0:end, 2] > 0.06).any():
                kind = "took the cube back out of the box"
            elif (action[t0:end, grip] > 0.8).any():
                kind = "opened the hand wide over the box"
            elif near.any():
                kind = "at the button, did not press it down"
            else:
                kind = "never went to the button"
            why.setdefault(kind, [0, 0])[int(slipped.get(int(store.meta(e).extra.get("seed", -1)), False))] += 1
        facts.setdefault(group, []).append((dist.min(), height[near].min() if near.any() else np.nan, min(press) * 1000,
                                            (dist < 5.0).mean(), end - t0, float(dist.min() >= 5.0)))
    rows = []
    for group, f in facts.items():
        a = np.array(f, dtype=float)
        rows.append((group, len(a), f"{np.median(a[:, 0]):.1f} [{a[:, 0].min():.1f}, {a[:, 0].max():.1f}]",
                     f"{a[:, 5].mean():.0%}", f"{np.nanmedian(a[:, 1]):.1f}" if np.isfinite(a[:, 1]).any() else "-",
                     f"{np.median(a[:, 2]):.1f} [{a[:, 2].min():.1f}, {a[:, 2].max():.1f}]", f"{np.median(a[:, 3]):.0%}",
                     f"{np.median(a[:, 4]):.0f} [{a[:, 4].min():.0f}, {a[:, 4].max():.0f}]"))
    show(f"{task_name}: the right hand after the cube is in the box ({args.rollouts}; medians (min, max); latches "
         f"at {task.latch_q * 1000:.0f} mm; {cpu_kind()})",
         ["episodes", "n", "closest to the button, across (cm)", "never within 5 cm", "lowest over its top within 2 cm (cm)",
          "button's deepest recorded (mm)", "steps within 5 cm", "steps from cube in box to latch / end"], rows)
    split = " (clean / the cube slipped, from --eval)" if slipped else ""
    show(f"{task_name}: why the cube in the box was not latched{split}", ["what the right hand did", "episodes"],
         [(k, f"{v[0]} / {v[1]}" if slipped else str(v[0])) for k, v in sorted(why.items())])


def run_openloop(args) -> None:
    from robo_rl.data.sampler import WindowSampler
    from robo_rl.policies import load_policy

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    policy = load_policy(args.checkpoint)
    keys = [*policy.shapes.lowdim, *policy.shapes.images]
    store = EpisodeStore.open(args.dataset, mode="r")
    cfg = policy.config
    sampler = WindowSampler(store, keys, n_obs=cfg.n_obs, horizon=cfg.horizon, episodes=range(min(TRAIN_EPISODES, store.n_episodes)))
    bins = [(0, 1), (1, 25), (25, 50), (50, 100), (100, 150), (150, 400)]
    ta = cfg.n_action_steps
    rng = np.random.default_rng(args.seed)
    rows = []
    lengths = {e: store.episode_range(e)[1] - store.episode_range(e)[0] for e in sampler.episodes}
    eps = list(sampler.episodes)
    offset = dict(zip(eps, np.cumsum([0] + [lengths[e] for e in eps[:-1]])))  # each episode's first window
    for lo, hi in bins:
        fit, by_frames, by_joints, demo_diff, n = [], [], [], [], 0
        for e in eps:
            other = eps[(eps.index(e) + 1 + rng.integers(len(eps) - 1)) % len(eps)]
            ts = [t for t in range(lo, hi, 8) if t < lengths[e] and t < lengths[other]]
            if not ts:
                continue
            mine = sampler.get(np.array([offset[e] + t for t in ts]))
            theirs = sampler.get(np.array([offset[other] + t for t in ts]))
            noise = torch.randn(len(ts), cfg.horizon, policy.shapes.action_dim)
            chunk = _predict(policy, {k: mine[k] for k in keys}, noise)
            frames_swapped = _predict(policy, {k: (theirs[k] if k in policy.shapes.images else mine[k]) for k in keys}, noise)
            joints_swapped = _predict(policy, {k: (mine[k] if k in policy.shapes.images else theirs[k]) for k in keys}, noise)
            fit.append(np.abs(chunk[:, :ta] - mine["action"][:, :ta]).mean(axis=(1, 2)))
            by_frames.append(np.abs(frames_swapped - chunk).mean(axis=(1, 2)))
            by_joints.append(np.abs(joints_swapped - chunk).mean(axis=(1, 2)))
            demo_diff.append(np.abs(theirs["action"] - mine["action"]).mean(axis=(1, 2)))
            n += len(ts)
        if n:
            f, fr, jo, d = (float(np.mean(np.concatenate(v))) for v in (fit, by_frames, by_joints, demo_diff))
            rows.append((f"{lo}-{hi - 1}" if hi - lo > 1 else str(lo), n, f"{f:.4f}", f"{d:.4f}", f"{fr:.4f}", f"{jo:.4f}"))
    show(f"open-loop chunks on training windows by start step ({args.checkpoint}; mean |action difference| in rad; {cpu_kind()})",
         ["window start (step)", "windows", f"first {ta} actions vs demo", f"whole chunk ({cfg.horizon}): two demos differ",
          "chunk moved by the other demo's frames", "chunk moved by the other demo's joints"], rows)


def _predict(policy, window, noise) -> np.ndarray:
    """The policy's chunks for raw windows, from the given noise (so two windows compare alike)."""
    with torch.no_grad():
        return policy.body.predict(lambda cond, steps: policy.sample(cond, steps, noise),
                                   {k: np.asarray(v) for k, v in window.items()}, None)


def gripper_facts(store: EpisodeStore, steps: list[int]) -> dict[int, tuple[tuple | None, list[float]]]:
    """Per episode (by seed), from joint positions by forward kinematics, relative to the cube's
    start pose (what the grasp had to aim at; a push moves the cube):
    - where the right gripper was at the first step its command closes (< 0.5): (dx cm, dy cm,
      yaw error deg, step), or None if it never closed;
    - its xy distance (cm) from the cube at each of `steps` (the last step if shorter)."""
    from robo_rl.sim.expert import grip_index
    from robo_rl.sim.robot import SimRobot
    from robo_rl.sim.tasks.pack_cube import _square_yaw_error  # a cube's faces repeat every 90 degrees

    robot = SimRobot("transfer_cube.xml", cameras=[])
    grip, site = grip_index(robot.spec, "right"), robot.model.site("right_ee").id
    qpos, act, state = (np.asarray(store.read(k)) for k in ("obs/qpos", "action", "obs/env_state"))

    def ee_at(t: int) -> tuple[np.ndarray, np.ndarray]:
        robot.set_joint_positions(qpos[t])
        return robot.data.site_xpos[site].copy(), robot.data.site_xmat[site].reshape(3, 3)

    out = {}
    for e in range(store.n_episodes):
        s, end = store.episode_range(e)
        cube = cube_pose(state[s])
        distances = [float(np.linalg.norm(ee_at(min(s + t, end - 1))[0][:2] - cube[:2]) * 100) for t in steps]
        closing = np.flatnonzero(act[s:end, grip] < 0.5)
        aim = None
        if len(closing):
            ee, rot = ee_at(s + int(closing[0]))
            jaw = math.atan2(rot[1, 1], rot[0, 1])  # the jaw axis is the site's y axis
            aim = ((ee[0] - cube[0]) * 100, (ee[1] - cube[1]) * 100, math.degrees(_square_yaw_error(cube[2], jaw)),
                   int(closing[0]))
        out[int(store.meta(e).extra.get("seed", e))] = (aim, distances)
    return out


def run_grasp(args) -> None:
    demos, rollouts = EpisodeStore.open(args.dataset, mode="r"), EpisodeStore.open(args.rollouts, mode="r")
    steps = [0, 20, 40, 60, 80, 100, 120]
    demo_facts, roll_facts = gripper_facts(demos, steps), gripper_facts(rollouts, steps)
    seeds = sorted(set(demo_facts) & set(roll_facts))
    show(f"the right gripper's xy distance from the cube's start position (cm, median over {len(seeds)} seeds)",
         ["episodes", *[f"step {t}" for t in steps]],
         [(name, *(f"{v:.1f}" for v in np.median([facts[k][1] for k in seeds], 0)))
          for name, facts in (("demos (the expert)", demo_facts), ("policy", roll_facts))])
    d = {k: aim for k, (aim, _) in demo_facts.items() if aim is not None}
    r = {k: aim for k, (aim, _) in roll_facts.items() if aim is not None}
    ok = {int(rollouts.meta(e).extra["seed"]): bool(rollouts.meta(e).success) for e in range(rollouts.n_episodes)}
    rows = []
    for name, aims, seeds in [("demos (the expert)", d, sorted(set(d) & set(ok))),
                              ("policy, succeeded", r, [k for k in sorted(r) if ok[k]]),
                              ("policy, failed", r, [k for k in sorted(r) if not ok[k]])]:
        if not seeds:
            continue
        a = np.array([aims[k] for k in seeds if k in aims])
        xy = np.hypot(a[:, 0], a[:, 1])
        rows.append((name, len(a), f"{np.median(xy):.2f}", f"{np.percentile(xy, 90):.2f}", f"{np.median(np.abs(a[:, 2])):.1f}",
                     f"{np.percentile(np.abs(a[:, 2]), 90):.1f}", f"{np.median(a[:, 3]):.0f}"))
    never = sum(1 for k in ok if k not in r)
    show(f"where the right gripper closes, relative to the cube ({args.rollouts}: {len(ok)} rollouts, {never} never closed; "
         f"demos {args.dataset})",
         ["episodes", "n", "xy off cm (median)", "xy off cm (90%)", "|yaw off| deg (median)", "|yaw off| deg (90%)", "step"], rows)


def run_position(args) -> None:
    from robo_rl.sim.envs import BimanualEnv

    result = json.loads(Path(args.eval).read_text())
    env = BimanualEnv(result["task"], obs_mode="state")
    poses = []
    for ep in result["per_episode"]:
        obs, _ = env.reset(seed=int(ep["seed"]))
        poses.append(cube_pose(obs["env_state"]))
    poses = np.array(poses)
    dist = np.linalg.norm(poses[:, :2] - poses[:, :2].mean(0), axis=1) * 100
    ok = np.array([e["success"] for e in result["per_episode"]])
    stage = np.array([e["max_stage"] for e in result["per_episode"]])
    edges = [0, 3, 6, 9, 100]
    rows = []
    for lo, hi in zip(edges[:-1], edges[1:]):
        m = (dist >= lo) & (dist < hi)
        if m.any():
            rows.append((f"{lo}-{hi} cm" if hi < 100 else f">= {lo} cm", int(m.sum()), f"{ok[m].mean():.0%}", f"{(stage[m] >= 1).mean():.0%}"))
    yaw = np.abs(poses[:, 2])
    for lo, hi in [(0, 0.25), (0.25, 0.5)]:
        m = (yaw >= lo) & (yaw < hi)
        rows.append((f"|yaw| {lo}-{hi} rad", int(m.sum()), f"{ok[m].mean():.0%}", f"{(stage[m] >= 1).mean():.0%}"))
    show(f"success by the cube's start pose ({args.eval}, {len(ok)} episodes, seeds from {result['per_episode'][0]['seed']})",
          ["cube start (distance from the mean)", "episodes", "success", "lifted"], rows)


def run_shifts(args) -> None:
    """What a shifted room does to a trained camera policy, held on the demos' own states (no
    closed loop): every demo of `--dataset` (the first `--episodes`) is replayed in the nominal room
    and in each shifted room, the same physics in each, and every 10th step's frames go through the
    policy. Per shift and camera: how much the mean pixel moves, and how far the camera's features
    move against their spread over the demo's states (1: as far as two different states lie apart).
    Then how far the policy's first 16 actions move (mean |change|, rad or gripper units, the same
    starting noise) when every camera sees the shifted room, and when only one does. `--stages`
    keeps only the states in those task stages (e.g. TransferCube's hand-over: 1 2), `--every`
    takes every n-th step."""
    from robo_rl.data.schema import IMAGE_PREFIX
    from robo_rl.policies import load_policy
    from robo_rl.policies.inference import predictor
    from robo_rl.sim.envs import BimanualEnv
    from robo_rl.sim.replay import load_episode, start_replay
    from robo_rl.sim.room import parse_shifts

    torch.set_num_threads(args.threads)
    policy = load_policy(args.checkpoint)
    keys = list(policy.shapes.images)
    cams = [k[len(IMAGE_PREFIX):] for k in keys]
    size = tuple(next(iter(policy.shapes.images.values())))
    store = EpisodeStore.open(args.dataset, mode="r")
    rooms = [None, *parse_shifts(args.shifts, cams)]
    frames: dict[str, dict[str, list]] = {}
    qpos: list[np.ndarray] = []
    grippers: list[int] = []
    for room in rooms:
        name = "nominal" if room is None else room.name
        frames[name] = {k: [] for k in keys}
        for i in range(min(args.episodes, store.n_episodes)):
            ep = load_episode(store, i)
            env = BimanualEnv(ep.task, "state+pixels", cams, size, room=room)
            grippers = sorted(env.robot.spec.grippers)
            start_replay(env, ep)
            if room is not None and room.distractor:
                env.robot.set_room(room, np.random.default_rng(i))
            for t in range(ep.length):
                obs, _, _, _, info = env.step(ep.action[t])
                # the stage is physics alone, so every room keeps the same states
                if t % args.every == 0 and (args.stages is None or info["stage"] in args.stages):
                    for k, c in zip(keys, cams):
                        frames[name][k].append(obs["images"][c])
                    if room is None:
                        qpos.append(obs["qpos"])
            env.close()
    if not qpos:
        raise SystemExit(f"shifts: no state of {args.dataset}'s first {args.episodes} episodes is in stages {args.stages}")
    nominal = {k: np.stack(v) for k, v in frames["nominal"].items()}
    q = np.stack(qpos)
    predict = predictor(policy)

    def chunks(images: dict[str, np.ndarray]) -> np.ndarray:
        torch.manual_seed(0)
        window = {"obs/qpos": q[:, None], **{k: v[:, None] for k, v in images.items()}}
        return predict(window)[:, :16]

    base = chunks(nominal)
    rows, looks = [], []
    for name in list(frames)[1:]:
        shifted = {k: np.stack(v) for k, v in frames[name].items()}
        looks.append((name, *(frame_look(shifted[k], nominal[k]) for k in keys)))
        cells = []
        for k in keys:
            f0, f1 = policy_features(policy, k, nominal[k]), policy_features(policy, k, shifted[k])
            spread = np.linalg.norm(f0 - f0.mean(0), axis=1).mean()
            clipped = (shifted[k] == 255).any(-1).mean()  # pixels white in a channel: detail the light erased
            cells.append(f"{shifted[k].mean() - nominal[k].mean():+.0f} px ({clipped:.0%} clipped), "
                         f"{np.linalg.norm(f1 - f0, axis=1).mean() / spread:.2f}")
        change = np.abs(chunks(shifted) - base)
        moved = [change.mean(), change[..., grippers].mean()]  # the grippers alone: when a hand opens or closes
        moved += [np.abs(chunks({**nominal, k: shifted[k]}) - base).mean() for k in keys]
        rows.append((name, *cells, *(f"{m:.3f}" for m in moved)))
    torch.manual_seed(1)
    noise_only = np.abs(chunks(nominal) - base).mean()
    clipped0 = ", ".join(f"{c} {(nominal[k] == 255).any(-1).mean():.0%}" for k, c in zip(keys, cams))
    where = f"stages {args.stages}, " if args.stages is not None else ""
    show(f"a shifted room through the policy, on {len(q)} recorded states ({where}every {args.every}th step; "
         f"{args.dataset}; {args.checkpoint}; mean pixel "
         f"change (pixels clipped at white; nominal: {clipped0}), feature shift / "
         f"spread; starting noise alone moves the actions {noise_only:.3f}; {cpu_kind()})",
         ["shift", *[f"{c}: pixel, features" for c in cams], "actions, all cameras shifted", "grippers' actions, all shifted",
          *[f"actions, only {c} shifted" for c in cams]], rows)
    show("how each shift changes the frames, as ratios to the nominal room's: mean grey, its spread within a frame "
         "(contrast), saturation; then each pixel's own ratio, median [10th, 90th percentile] (pixels neither dark "
         "nor clipped)", ["shift", *cams], looks)


def run_parting(args) -> None:
    """Where a shifted room's rollouts leave the nominal room's, seed by seed (see the module's
    docstring). A pair has parted once any arm joint differs by more than `--part-rad`."""
    from robo_rl.sim.critic_data import STAGE_KEY
    from robo_rl.sim.tasks import make_task

    stores = {name: EpisodeStore.open(path, mode="r") for name, path in (("nominal", args.rollouts), ("shifted", args.shifted))}
    by_seed = {name: {st.meta(e).extra["seed"]: e for e in range(st.n_episodes)} for name, st in stores.items()}
    seeds = sorted(set(by_seed["nominal"]) & set(by_seed["shifted"]))
    if not seeds:
        raise SystemExit(f"parting: {args.rollouts} and {args.shifted} share no seed")
    task = stores["nominal"].meta(0).task
    stage_names = make_task(task).stage_names
    groups: dict[str, list] = {}
    for seed in seeds:
        eps = {n: stores[n].episode(by_seed[n][seed], ["obs/qpos", STAGE_KEY]) for n in stores}
        ok = {n: bool(stores[n].meta(by_seed[n][seed]).success) for n in stores}
        n = min(len(eps["nominal"]["obs/qpos"]), len(eps["shifted"]["obs/qpos"]))
        gap = np.abs(eps["nominal"]["obs/qpos"][:n] - eps["shifted"]["obs/qpos"][:n]).max(1)
        parted = np.flatnonzero(gap > args.part_rad)
        t = int(parted[0]) if len(parted) else None
        group = {(True, True): "both succeed", (True, False): "nominal only", (False, True): "shifted only",
                 (False, False): "neither"}[(ok["nominal"], ok["shifted"])]
        groups.setdefault(group, []).append((t, None if t is None else int(eps["nominal"][STAGE_KEY][t]),
                                             int(eps["nominal"][STAGE_KEY].max()), int(eps["shifted"][STAGE_KEY].max())))
    def count(values) -> str:  # "reach 2, held_by_left 9": episodes per stage
        return ", ".join(f"{stage_names[v]} {values.count(v)}" for v in sorted(set(values)))

    rows = []
    for group in ("both succeed", "nominal only", "shifted only", "neither"):
        pairs = groups.get(group, [])
        if not pairs:
            continue
        steps = [p[0] for p in pairs if p[0] is not None]
        rows.append((group, len(pairs), f"{len(pairs) - len(steps)}", f"{np.median(steps):.0f}" if steps else "-",
                     count([p[1] for p in pairs if p[1] is not None]) or "-", count([p[2] for p in pairs]),
                     count([p[3] for p in pairs])))
    show(f"{task}: where the shifted room's rollouts part from the nominal room's ({len(seeds)} seeds; parted: a joint "
         f"more than {args.part_rad} rad apart; {args.rollouts} vs {args.shifted})",
         ["pairs", "n", "never part", "median step they part", "nominal's stage there", "nominal ends in (furthest stage)",
          "shifted ends in"], rows)


def frame_look(shifted: np.ndarray, nominal: np.ndarray) -> str:
    """The shifted frames' mean grey, its spread within a frame and their saturation, each as a
    ratio to the nominal frames': what a brightness, contrast or saturation factor would match."""
    from robo_rl.policies.nets.encoders import LUMA

    def stats(frames: np.ndarray) -> np.ndarray:
        x = frames.astype(np.float64) / 255
        grey = x @ np.array(LUMA)
        top, bottom = x.max(-1), x.min(-1)
        sat = (top - bottom) / np.maximum(top, 1e-6)
        return np.array([grey.mean(), grey.std(axis=(1, 2)).mean(), sat.mean()])

    r = stats(shifted) / np.maximum(stats(nominal), 1e-9)
    # pixel by pixel (neither dark nor clipped): one gain for the whole frame gives a narrow band; a
    # light that brightens the shadows more than the lit parts, a wide one
    kept = (nominal > 20) & (shifted < 250)
    gain = np.percentile(shifted[kept].astype(np.float64) / nominal[kept], [10, 50, 90]) if kept.any() else [np.nan] * 3
    return f"{r[0]:.2f}x, {r[1]:.2f}x, {r[2]:.2f}x; pixels {gain[1]:.2f}x [{gain[0]:.2f}, {gain[2]:.2f}]"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("part", choices=["probe", "align", "reach", "stuck", "aim", "grip", "handover", "latch", "openloop", "position",
                                     "grasp", "shifts", "parting"])
    ap.add_argument("--rollouts")
    ap.add_argument("--dataset")
    ap.add_argument("--checkpoint")
    ap.add_argument("--eval")
    ap.add_argument("--shifted", help="parting: the shifted room's rollouts (the same seeds as --rollouts)")
    ap.add_argument("--part-rad", type=float, default=0.05, help="parting: joint gap (rad) at which two runs have parted")
    ap.add_argument("--cameras", nargs="*")
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--crop-ratio", type=float, default=0.9)
    ap.add_argument("--bf16", action="store_true")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--grips", type=float, nargs="*", default=[8, 8.5, 9, 9.5, 10, 11, 12, 13], help="grip: cm from the peg's tip")
    ap.add_argument("--expert-episodes", type=int, default=12, help="grip: scripted episodes per distance")
    ap.add_argument("--episodes", type=int, default=5, help="shifts: demos replayed")
    ap.add_argument("--shifts", nargs="*", default=["light", "camera", "table", "distractor"], help="shifts: the rooms (eval's names)")
    ap.add_argument("--stages", type=int, nargs="*", default=None, help="shifts: only the states in these task stages")
    ap.add_argument("--every", type=int, default=10, help="shifts: every n-th step of each episode")
    args = ap.parse_args()
    {"probe": run_probe, "align": run_align_probe, "reach": run_reach_probe, "stuck": run_stuck, "aim": run_aim, "grip": run_grip, "handover": run_handover, "latch": run_latch, "openloop": run_openloop, "position": run_position, "grasp": run_grasp,
     "shifts": run_shifts, "parting": run_parting}[args.part](args)


if __name__ == "__main__":
    main()
