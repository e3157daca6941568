"""The twin's rooms (robo_rl/sim/room.py): each shift changes the rendered frame as its name says,
none changes the physics, randomised rooms never move the task's draws, and `eval shifts=` writes
its report on the nominal row's seeds. Real MuJoCo rendering throughout (MUJOCO_GL=egl)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from robo_rl.errors import ConfigError
from robo_rl.sim.envs import BimanualEnv
from robo_rl.sim.room import Room, RoomRandomizer, parse_shifts
from tests.conftest import robo_rl_cli, robo_rl_in_process

CAMERAS = ["top", "left_wrist", "right_wrist"]
SIZE = (120, 160)


def first_frame(room: Room | None, seed: int = 3, camera: str = "top") -> np.ndarray:
    env = BimanualEnv("transfer_cube", "pixels", CAMERAS, SIZE, room=room)
    try:
        obs, _ = env.reset(seed=seed)
        return obs["images"][camera].astype(np.float64)
    finally:
        env.close()


def best_shift(a: np.ndarray, b: np.ndarray, axis: int, span: int = 8) -> int:
    """The whole-pixel shift s along `axis` (1: columns, 0: rows) that best maps a onto b: b[i] ~ a[i - s]."""
    grey_a, grey_b = a.mean(-1), b.mean(-1)
    errors = {}
    for s in range(-span, span + 1):
        moved = np.roll(grey_a, s, axis=axis)
        inner = (slice(span, -span),) * 2
        errors[s] = np.abs(moved[inner] - grey_b[inner]).mean()
    return min(errors, key=errors.get)


@pytest.fixture(scope="module")
def nominal():
    return first_frame(None)


def room(name: str) -> Room:
    return parse_shifts([name], CAMERAS)[0]


def test_dim_and_bright_light_move_the_mean_pixel_down_and_up(nominal):
    dim, bright = first_frame(room("light:0.6")), first_frame(room("light:1.5"))
    assert dim.mean() < 0.8 * nominal.mean()
    assert bright.mean() > nominal.mean() + 1


def test_exposure_scales_the_rendered_pixels_and_clips_them_at_white(nominal):
    bright, dark = first_frame(room("exposure:1.5")), first_frame(room("exposure:0.5"))
    np.testing.assert_array_equal(bright, np.clip(np.floor(nominal * 1.5 + 0.5), 0, 255))
    np.testing.assert_array_equal(dark, np.floor(nominal * 0.5 + 0.5))
    assert (bright == 255).mean() > (nominal == 255).mean()


def test_a_camera_moved_sideways_sees_the_scene_shifted_and_a_tilted_one_sees_it_move_up_or_down(nominal):
    moved = first_frame(room("camera_move:top:3"))
    assert best_shift(nominal, moved, axis=1) < 0  # the camera went right (its image's x): the scene goes left
    assert best_shift(nominal, moved, axis=0) == 0
    tilted = first_frame(room("camera_tilt:top:3"))
    assert best_shift(nominal, tilted, axis=0) != 0
    assert abs(best_shift(nominal, tilted, axis=1)) <= 1
    # a wrist camera's shift moves that camera only
    wrist = parse_shifts(["camera_move:left_wrist:3"], CAMERAS)[0]
    np.testing.assert_array_equal(first_frame(wrist), nominal)
    assert not np.array_equal(first_frame(wrist, camera="left_wrist"), first_frame(None, camera="left_wrist"))


def test_a_blue_table_turns_the_table_blue_and_leaves_the_rest(nominal):
    blue = first_frame(room("table:blue"))
    changed = np.abs(blue - nominal).sum(-1) > 30
    assert 0.2 < changed.mean() < 0.95  # the table, not the whole frame
    assert nominal[changed][:, 2].mean() < nominal[changed][:, 0].mean()  # brown: more red than blue
    assert blue[changed][:, 2].mean() > blue[changed][:, 0].mean()


def test_a_distractor_stands_on_the_table_in_a_small_patch_of_its_own_colour(nominal):
    frames = [first_frame(room("distractor"), seed=s) for s in (3, 4)]
    changed = np.abs(frames[0] - nominal).sum(-1) > 30
    assert 0.002 < changed.mean() < 0.08
    patch = frames[0][changed]
    assert patch[:, 1].mean() > patch[:, 0].mean() and patch[:, 2].mean() > patch[:, 0].mean()  # teal
    assert not np.array_equal(frames[0], frames[1])  # placed from each episode's seed


def test_a_distractor_takes_the_colour_it_is_given_and_aside_keeps_off_the_objects_rows(nominal):
    teal, yellow = first_frame(room("distractor")), first_frame(room("distractor:yellow"))
    teal_patch, yellow_patch = (np.abs(f - nominal).sum(-1) > 30 for f in (teal, yellow))
    assert (teal_patch & yellow_patch).sum() > 0.8 * teal_patch.sum()  # the same place on the same seed
    patch = yellow[yellow_patch]
    assert patch[:, 0].mean() > patch[:, 2].mean() + 80 and patch[:, 1].mean() > patch[:, 2].mean() + 80  # yellow
    sides = {}
    for name in ("distractor", "distractor:aside:grey"):
        env = BimanualEnv("transfer_cube", "pixels", CAMERAS, (48, 64), room=room(name))
        ys = []
        for seed in range(12):
            env.reset(seed=seed)
            ys.append(abs(float(env.robot.data.mocap_pos[env.robot.rooms.distractor_mocap][1])))
        env.close()
        sides[name] = np.array(ys)
    assert sides["distractor:aside:grey"].min() >= 0.18
    assert sides["distractor"].min() < 0.18  # anywhere: it also stands among the objects' rows
    with pytest.raises(ConfigError, match="distractor\\[:aside\\]\\[:COLOUR\\]"):
        parse_shifts(["distractor:purple"], CAMERAS)


def test_no_room_changes_the_physics():
    actions = np.random.default_rng(0).uniform(-0.05, 0.05, (30, 14))
    runs = []
    for r in (None, room("light:0.6"), room("camera_tilt:top:2"), room("distractor"), RoomRandomizer()):
        env = BimanualEnv("transfer_cube", "pixels", CAMERAS, (48, 64), room=r if isinstance(r, Room) else None,
                          randomize=r if isinstance(r, RoomRandomizer) else None)
        obs, _ = env.reset(seed=11)
        home = env.robot.spec.home
        states = [env.sim_state()]
        for a in actions:
            env.step(home + a)
            states.append(env.sim_state())
        env.close()
        runs.append(np.array(states))
    for other in runs[1:]:
        np.testing.assert_array_equal(other, runs[0])


def test_a_randomised_room_is_drawn_from_the_seed_and_never_moves_the_tasks_draws():
    env = BimanualEnv("transfer_cube", "state+pixels", ["top"], (48, 64), randomize=RoomRandomizer())
    plain = BimanualEnv("transfer_cube", "state", ["top"])
    rooms = []
    for seed in (1, 2, 1):
        obs, _ = env.reset(seed=seed)
        rooms.append(env.room)
        np.testing.assert_array_equal(obs["env_state"], plain.reset(seed=seed)[0]["env_state"])
    assert rooms[0] == rooms[2] and rooms[0] != rooms[1]
    lights = [env.reset(seed=s)[0] and env.room.light for s in range(40)]
    assert min(lights) < 0.6 and max(lights) > 1.5  # the report's light shifts lie inside what the demos show
    env.close()
    plain.close()


def test_unknown_and_unshowable_shifts_are_refused_in_one_line(checkpoints, capsys):
    with pytest.raises(ConfigError, match="unknown shift 'lite'; known: light, camera"):
        parse_shifts(["lite"], CAMERAS)
    with pytest.raises(ConfigError, match="does not see camera 'left_wrist'"):
        parse_shifts(["camera_move:left_wrist:1"], ["top"])
    with pytest.raises(ConfigError, match="not a number"):
        parse_shifts(["light:bright"], CAMERAS)
    assert [r.name for r in parse_shifts(["light", "camera", "light:0.6"], CAMERAS)] == \
        ["light:0.6", "light:1.5", "camera_move:top:1", "camera_tilt:top:2"]
    code, err = robo_rl_in_process(capsys, "eval", f"checkpoint={checkpoints['camera']}", "shifts=[lite]")
    assert code == 2 and err.count("\n") == 1 and "unknown shift 'lite'" in err
    code, err = robo_rl_in_process(capsys, "eval", f"checkpoint={checkpoints['camera']}", "shifts=[camera_tilt:right_wrist:2]")
    assert code == 2 and "does not see camera 'right_wrist' (its cameras: top)" in err
    code, err = robo_rl_in_process(capsys, "eval", f"checkpoint={checkpoints['qpos']}", "shifts=[light]")
    assert code == 2 and "without cameras" in err


def test_eval_shifts_reports_every_condition_on_the_nominal_rows_seeds_and_records_each_room(checkpoints, tmp_path):
    from robo_rl.data.store import EpisodeStore

    out, rollouts = tmp_path / "report", tmp_path / "rollouts"
    r = robo_rl_cli("eval", f"checkpoint={checkpoints['camera']}", "episodes=2", "n_envs=2", "videos=0", "max_steps=30",
                    "shifts=[light:0.6,distractor]", f"out={out}", f"record={rollouts}")
    assert r.returncode == 0, r.stderr
    rows = json.loads((out / "shifts.json").read_text())
    assert [row["shift"] for row in rows] == ["nominal", "light:0.6", "distractor"]
    seeds = [[e["seed"] for e in row["per_episode"]] for row in rows]
    assert seeds[0] == seeds[1] == seeds[2] == [100000, 100001]
    assert (out / "shifts.png").stat().st_size > 5000
    assert "light 0.6x" in r.stdout and "points vs nominal" in r.stdout
    # record=: one store per room, the same seeds, each episode naming its room, the frames as the room shows them
    stores = {name: EpisodeStore.open(rollouts / name, mode="r") for name in ("nominal", "light_0.6", "distractor")}
    for name, store in stores.items():
        assert [store.meta(i).extra["seed"] for i in range(store.n_episodes)] == [100000, 100001], name
    assert stores["light_0.6"].meta(0).extra["room"] == "light 0.6x"
    first = {name: store.episode(0)["obs/images/top"][0].astype(float).mean() for name, store in stores.items()}
    assert first["light_0.6"] < 0.85 * first["nominal"], first


def test_collect_records_each_demo_in_a_room_of_its_own_and_refuses_a_room_without_cameras(tmp_path, capsys, checkpoints):
    from robo_rl.data.store import EpisodeStore

    out = tmp_path / "demos"
    r = robo_rl_cli("collect", "task=transfer_cube", "episodes=2", "cameras=[top]", "image_size=[48,64]",
                    "randomize_room=true", f"out={out}")
    assert r.returncode == 0, r.stderr
    store = EpisodeStore.open(out, mode="r")
    rooms = [store.meta(i).extra["room"] for i in range(store.n_episodes)]
    assert len(set(rooms)) == 2 and all("light" in room for room in rooms), rooms
    code, err = robo_rl_in_process(capsys, "collect", "task=transfer_cube", "episodes=1", "cameras=[]", "randomize_room=true",
                                   f"out={tmp_path / 'none'}")
    assert code == 2 and "changes only what cameras see" in err and err.count("\n") == 1
    code, err = robo_rl_in_process(capsys, "rac", f"checkpoint={checkpoints['qpos']}", "randomize_room=true",
                                   f"out={tmp_path / 'rac'}")
    assert code == 2 and "holds a policy without cameras" in err
