"""The MuJoCo twin: description agreement, physics determinism, task env API, expert quality."""

import subprocess
import sys

import gymnasium as gym
import mujoco
import numpy as np
import pytest

from robo_rl.data.store import EpisodeStore
from robo_rl.errors import RoboRLError
from robo_rl.hardware.robot import Robot, RobotSpec
from robo_rl.sim.envs import BimanualEnv
from robo_rl.sim.expert import ExpertNoise
from robo_rl.sim.robot import SIM_DIR, SimRobot


def test_twin_matches_the_hardware_description_joint_for_joint():
    spec = RobotSpec.from_yaml("aloha")
    model = mujoco.MjModel.from_xml_path(str(SIM_DIR / "aloha.xml"))
    actuators = [model.actuator(i).name for i in range(model.nu)]
    assert actuators == list(spec.joint_names), "actuators must be in the description's action order"
    for i, name in enumerate(spec.joint_names):
        if i in spec.grippers:
            # the gripper's actuator drives the finger joint, whose travel is the twin's own gripper
            # range; ALOHA's wire unit is that same finger travel, so the description agrees with it
            g = spec.grippers[i]
            assert model.actuator(name).trntype == mujoco.mjtTrn.mjTRN_JOINT
            finger = model.joint(model.actuator(name).trnid[0])
            assert finger.name == name.replace("gripper", "finger")
            assert g.unit == "finger_m" and tuple(finger.range) == pytest.approx((g.closed, g.open)), name
        else:
            j = model.joint(name)
            assert tuple(j.range) == pytest.approx((spec.lower[i], spec.upper[i]), abs=1e-5), name
            assert model.joint(model.actuator(name).trnid[0]).name == name
    cams = {model.camera(i).name for i in range(model.ncam)}
    assert {c.name for c in spec.cameras} <= cams
    assert 1.0 / (model.opt.timestep * round(1 / (spec.control_hz * model.opt.timestep))) == pytest.approx(spec.control_hz)


def test_sim_robot_is_a_robot_and_reports_what_it_executed():
    r = SimRobot(cameras=["top"], image_size=(48, 64))
    assert isinstance(r, Robot)
    r.connect()
    obs = r.observe()
    assert obs.qpos.shape == (14,) and obs.images["top"].shape == (48, 64, 3) and obs.images["top"].dtype == np.uint8
    assert np.allclose(obs.qpos, r.spec.home, atol=1e-5)
    wild = r.spec.home.copy()
    wild[1] = 9.0  # shoulder far past its limit
    wild[6] = 1.7  # gripper past fully open
    executed = r.act(wild)
    assert executed[1] == pytest.approx(r.spec.upper[1]) and executed[6] == pytest.approx(1.0)
    with pytest.raises(RoboRLError, match="NaN"):
        r.act(np.full(14, np.nan))
    with pytest.raises(RoboRLError, match="shape"):
        r.act(np.zeros(13))
    r.close()


def test_commanded_positions_are_tracked():
    r = SimRobot(cameras=[])
    home = r.spec.home.copy()
    errs = []
    for k in range(150):
        a = home + 0.3 * np.sin(np.pi * k / 50) * np.array([1, 1, 1, 1, 1, 1, 0] * 2)
        r.act(a)
        if k > 25:
            errs.append(np.abs(r.joint_positions() - a))
    assert np.mean(errs) < 0.02, np.mean(errs, axis=0)  # 0.94 rad/s peak: about one tick of lag


def _rollout(seed, steps=120):
    env = BimanualEnv("transfer_cube")
    obs, _ = env.reset(seed=seed)
    expert = env.expert()
    qs = []
    for _ in range(steps):
        obs, *_ = env.step(expert.act())
        qs.append(np.concatenate([obs["qpos"], obs["env_state"]]))
    return np.array(qs)


def test_same_seed_same_trajectory():
    a, b, c = _rollout(3), _rollout(3), _rollout(4)
    assert np.array_equal(a, b)
    assert not np.allclose(a, c)


@pytest.mark.parametrize("env_id", ["robo_rl/TransferCube-v0", "robo_rl/Insertion-v0", "robo_rl/PackCube-v0"])
def test_env_passes_gymnasium_checks_in_every_mode(env_id):
    from gymnasium.utils.env_checker import check_env

    for mode in ("state", "pixels", "state+pixels"):
        env = gym.make(env_id, obs_mode=mode, cameras=["top", "left_wrist"], image_size=(32, 40))
        check_env(env.unwrapped, skip_render_check=True)
        obs, info = env.reset(seed=0)
        assert info["stage"] == 0 and env.observation_space.contains(obs)
        env.close()


@pytest.mark.parametrize("task", ["transfer_cube", pytest.param("insertion", marks=pytest.mark.slow),
                                  pytest.param("pack_cube", marks=pytest.mark.slow), "pack_cube_nolid"])  # 8 / 18 s (AMD EPYC, AVX2)
def test_scripted_expert_succeeds_and_varies(task):
    env = BimanualEnv(task)
    wins, lengths = 0, []
    for seed in range(10):
        env.reset(seed=seed)
        expert = env.expert(ExpertNoise())
        for t in range(env.max_steps):
            _, _, term, trunc, info = env.step(expert.act())
            if term or trunc:
                break
        wins += info["success"]
        lengths.append(t)
    assert wins >= 9, f"{wins}/10"
    assert len(set(lengths)) > 5, "demos should vary in length like human teleop"


def test_insertion_expert_grips_the_peg_where_grasp_along_says_and_plans_the_same_demo_without_it():
    """`collect grasp_along=` moves the right hand's grip along the peg's axis and nowhere else; a
    fixed shift draws no random number, so the rest of each demo (its speed, offsets) stays as it was."""
    from robo_rl.sim.tasks import body_yaw

    env = BimanualEnv("insertion")
    plans = {}
    for along in [(0.0, 0.0), (0.02, 0.02), (-0.01, 0.02)]:
        env.reset(seed=3)
        expert = env.expert(ExpertNoise(grasp_along=along))
        plans[along] = (expert.segments[0].right.pos.copy(), expert.speed)
    yaw = body_yaw(env.robot, "peg")
    axis = np.array([np.cos(yaw), np.sin(yaw), 0.0])
    usual, usual_speed = plans[(0.0, 0.0)]
    assert np.allclose(plans[(0.02, 0.02)][0] - usual, 0.02 * axis, atol=1e-9)
    assert plans[(0.02, 0.02)][1] == usual_speed
    moved = plans[(-0.01, 0.02)][0] - usual
    assert -0.01 <= moved @ axis <= 0.02 and abs(moved @ axis) > 1e-6
    assert np.allclose(moved, (moved @ axis) * axis, atol=1e-9)  # along the peg only
    env.close()


def test_collect_writes_a_store_with_replayable_initial_states(tmp_path):
    out = tmp_path / "demos"
    r = subprocess.run([sys.executable, "-m", "robo_rl.cli.main", "collect", "task=transfer_cube", "episodes=2",
                        f"out={out}", "cameras=[top]", "image_size=[32,40]"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "expert success rate" in r.stdout
    with EpisodeStore.open(out) as store:
        assert store.n_episodes == 2 and store.validate() == []
        assert store.schema.keys["obs/images/top"].shape == (32, 40, 3)
        m = store.meta(0)
        assert m.success and m.source == "scripted" and len(m.extra["init_state"]) > 30
        ep = store.episode(0)
        assert (ep["segment"] == 4).all()  # SCRIPTED
        # the recorded initial state is the state the episode started from
        env = BimanualEnv("transfer_cube")
        env.set_sim_state(np.array(m.extra["init_state"]))
        assert np.allclose(env.robot.joint_positions(), ep["obs/qpos"][0], atol=1e-6)
        assert np.allclose(env.task.state(env.robot), ep["obs/env_state"][0], atol=1e-6)


@pytest.mark.parametrize("task", ["pack_cube", "pack_cube_nolid"])
def test_pack_cube_stages_follow_the_sub_tasks_in_order(task):
    """The long-horizon task (and its lid-free CPU size) passes through every stage in order on an
    expert run, and an expert planned mid-task (as an operator's correction will be) starts from
    the stage it finds."""
    env = BimanualEnv(task)
    env.reset(seed=5)
    expert = env.expert(ExpertNoise.none())
    seen = []
    for _ in range(env.max_steps):
        _, _, term, trunc, info = env.step(expert.act())
        if not seen or info["stage"] != seen[-1]:
            seen.append(info["stage"])
        if info["stage"] == 2 and not hasattr(env, "_replanned"):
            env._replanned = True
            expert = env.expert(ExpertNoise.none())  # re-plan from stage 2: (lid, then) latch
            assert expert.segments[0].stage == 2 and expert.segments[0].name == "clear_right"
            assert ("approach_lid" in [g.name for g in expert.segments]) == (task == "pack_cube")
        if term or trunc:
            break
    assert info["success"]
    firsts = [s for i, s in enumerate(seen) if s not in seen[:i]]
    assert firsts == list(range(len(env.task.stage_names))), seen


def _drop_lid(task, robot, offset_xy, yaw_error, height=0.005, box_yaw=0.2):
    """Release the lid `height` above its seat, offset in the box's frame, and let it settle (2 s)."""
    import mujoco

    from robo_rl.sim.tasks import set_free_body

    robot.reset()
    box = np.array([-0.03, -0.07, 0.03])
    set_free_body(robot, "box", box, box_yaw)
    c, s = np.cos(box_yaw), np.sin(box_yaw)
    dx, dy = offset_xy
    set_free_body(robot, "lid", box + [c * dx - s * dy, s * dx + c * dy, task.seat_dz + height], box_yaw + yaw_error)
    set_free_body(robot, "cube", np.array([0.15, 0.0, 0.02]), 0.0)
    mujoco.mj_forward(robot.model, robot.data)
    for _ in range(1000):
        mujoco.mj_step(robot.model, robot.data)
    return task.lid_seated(robot)


def test_pack_cube_rim_centres_a_lid_released_near_the_box_and_not_a_far_one():
    """The box's chamfered rim guides a lid released within ~6 mm of centre (skirt clearance 4 mm)
    onto the walls, skewed up to 3.4 degrees included; one released 2 cm off rests on the rim, tilted,
    and is not seated: a failure a retry (lift and place again) fixes."""
    from robo_rl.sim.robot import SimRobot
    from robo_rl.sim.tasks import PackCube

    task = PackCube()
    robot = SimRobot(task.scene, cameras=[])
    for offset in [(0.0, 0.0), (0.003, 0.0), (0.006, 0.0), (0.0, -0.006), (0.004, 0.004), (-0.0042, 0.0042)]:
        for yaw in (0.0, 0.06):
            assert _drop_lid(task, robot, offset, yaw), (offset, yaw)
    for offset in [(0.02, 0.0), (0.0, -0.022), (0.015, 0.015)]:
        assert not _drop_lid(task, robot, offset, 0.0), offset
        up = robot.data.body("lid").xmat.reshape(3, 3)[:, 2]
        assert up[2] < np.cos(np.radians(3)), "a lid off the walls rests tilted on the rim"


@pytest.mark.parametrize("offset", [(0.02, 0.0), (0.0, 0.021), (-0.02, 0.0)])
def test_pack_cube_expert_regrasps_a_lid_resting_on_the_rim(offset):
    """An operator's correction plans the expert from where things are: a lid dropped 2 cm short
    rests on the rim, higher than on the table, and is grasped there, lifted and seated. Grasping
    at the table's height pressed it into the rim; across the hinge side (0, 2.1 cm) that knocked
    the cube out and the lid was never seated."""
    import mujoco

    from robo_rl.sim.tasks import set_free_body

    env = BimanualEnv("pack_cube")
    env.reset(seed=3)
    expert = env.expert(ExpertNoise.none())
    while env.task.stage(env.robot) < 2 or expert.segment.name != "approach_lid":
        env.step(expert.act())
    robot, task = env.robot, env.task
    box = robot.data.body("box")
    yaw = float(np.arctan2(box.xmat[3], box.xmat[0]))
    set_free_body(robot, "lid", box.xpos + box.xmat.reshape(3, 3) @ [*offset, task.seat_dz + 0.005], yaw)
    mujoco.mj_forward(robot.model, robot.data)
    hold = expert.act()
    for _ in range(50):  # let the lid settle on the rim
        env.step(hold)
    assert not task.lid_seated(robot) and robot.data.body("lid").xpos[2] > 0.05
    expert = env.expert(ExpertNoise.none(), start_command=hold)
    stages = []
    for _ in range(600):
        _, _, _, _, info = env.step(expert.act())
        stages.append(info["stage"])
        if info["stage"] >= 4:
            break
    assert min(stages) >= 2, "the cube was knocked out of the box"
    assert 3 in stages and stages[-1] >= 4, f"the lid was not lifted off the rim and seated: {sorted(set(stages))}"


def test_env_and_robot_report_joints_in_the_same_units():
    env = BimanualEnv("transfer_cube")
    env.reset(seed=0)
    a = env.robot.spec.home.copy()
    a[6] = a[13] = 0.2  # grippers closing: non-zero gripper velocity
    obs, *_ = env.step(a)
    direct = env.robot.observe()
    assert np.array_equal(obs["qpos"], direct.qpos) and np.array_equal(obs["qvel"], direct.qvel)
    assert abs(obs["qvel"][6]) > 0.1  # normalised units per second, not metres per second


def test_pack_cube_slip_drops_the_carried_cube_only_in_disturbed_envs():
    """The disturbance of policy rollouts: the carried cube slips out of the fingers (physically:
    no friction for a few steps), falls to the table and the task is back at its start; the grip
    comes back afterwards. The scene of a seed is the same with or without disturbances, and a
    clean env (demos) never slips."""
    from robo_rl.sim.tasks import body_pos, grasped

    def carry(disturb: bool, seed: int = 4):
        env = BimanualEnv("pack_cube", disturb=disturb)
        env.task.slip_prob = 1.0
        env.reset(seed=seed)
        start = env.sim_state()
        expert = env.expert(ExpertNoise.none())
        for t in range(300):
            _, _, _, _, info = env.step(expert.act())
            if info["disturbance"] is not None:
                return env, start, t, info
        return env, start, None, info

    clean, clean_start, slipped_at, _ = carry(disturb=False)
    assert slipped_at is None and clean.task.stage(clean.robot) >= 1, "a clean env carried the cube without a slip"
    env, start, slipped_at, info = carry(disturb=True)
    np.testing.assert_array_equal(start, clean_start)
    assert info["disturbance"] == "cube slipped" and slipped_at is not None
    friction = clean.robot.model.geom_friction.copy()
    assert not np.array_equal(env.robot.model.geom_friction, friction), "the slip takes the friction away"
    hold = env.robot.joint_positions()
    stages = [env.step(hold)[4]["stage"] for _ in range(40)]
    assert body_pos(env.robot, "cube")[2] < 0.03 and not grasped(env.robot, "cube", "right"), "the cube fell to the table"
    assert stages[-1] == 0
    np.testing.assert_array_equal(env.robot.model.geom_friction, friction)
    assert all(env.step(hold)[4]["disturbance"] is None for _ in range(20)), "once per episode"
    env.close()
    clean.close()


def test_cameras_render_supersampled_and_area_averaged():
    """render_scale k renders k times larger and area-averages down, as a sensor integrates light:
    the frame is the mean of the big render's k x k blocks, and a scale the scene's offscreen
    buffer cannot hold falls back to the largest that fits."""
    from robo_rl.data.codecs import resize_rgb

    point = SimRobot("transfer_cube.xml", cameras=["top"], image_size=(48, 64), render_scale=1)
    smooth = SimRobot("transfer_cube.xml", cameras=["top"], image_size=(48, 64), render_scale=3)
    big = SimRobot("transfer_cube.xml", cameras=["top"], image_size=(144, 192), render_scale=1)
    try:
        frame, reference = smooth.render()["top"], resize_rgb(big.render()["top"], (48, 64))
        assert frame.shape == (48, 64, 3) and frame.dtype == np.uint8
        assert np.abs(frame.astype(int) - reference.astype(int)).max() <= 1
        assert not np.array_equal(frame, point.render()["top"])  # edges are now blends, not point samples
        assert SimRobot("transfer_cube.xml", cameras=["top"], image_size=(240, 320), render_scale=4).render_scale == 2
    finally:
        for robot in (point, smooth, big):
            robot.close()
