"""rosbag2 import: bags written by the `rosbags` library itself (MCAP and sqlite3) become stores
with the right values and camera frames at the store's rate."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from episodes import make_episode, small_schema
from rosbags.rosbag2 import StoragePlugin, Writer
from rosbags.typesys import Stores, get_typestore

from robo_rl.data.store import EpisodeStore
from robo_rl.hardware.robot import RobotSpec

JOINTS = ["waist", "shoulder", "elbow", "forearm_roll", "wrist_angle", "wrist_rotate", "gripper"]
T0 = 1_700_000_000.0  # bag time of the first message (s)
# Cameras in a bag: (topic, first frame at (s), rate (Hz)). The first is raw bgr8 on the robot
# description's topic for `top`; the second JPEG on a topic of its own.
RAW_CAM = ("/cam_high/image_raw", 0.01, 30.0)
JPEG_CAM = ("/cam_left_wrist/image_raw/compressed", 0.02, 20.0)
FRAME_HW = (48, 64)


def frame_colour(cam: int, i: int) -> tuple[int, int, int]:
    """The flat RGB colour of frame i of camera `cam`: frames 8 apart in red, so JPEG's error cannot blur them."""
    r = (8 * i + 40 * cam) % 256
    return r, 255 - r, 60 + 100 * cam


def joint_value(arm: int, j: int, t: np.ndarray | float) -> np.ndarray | float:
    """What joint j of arm `arm` reads at t seconds into the bag: linear, so interpolation is exact."""
    return 0.01 * (j + 1) + (0.1 + 0.05 * arm) * np.asarray(t) * (1 if j != 6 else 0.01)


def write_bag(path: Path, plugin: StoragePlugin, seconds: float = 2.0, split_at: float | None = None,
              cameras: bool = False, bad_jpeg_at: int | None = None) -> dict[str, list[int]]:
    """Returns each camera topic's message times (ns), empty without cameras."""
    store = get_typestore(Stores.ROS2_HUMBLE)
    JointState = store.types["sensor_msgs/msg/JointState"]
    Header = store.types["std_msgs/msg/Header"]
    Time = store.types["builtin_interfaces/msg/Time"]
    Duration = store.types["builtin_interfaces/msg/Duration"]
    Traj = store.types["trajectory_msgs/msg/JointTrajectory"]
    Point = store.types["trajectory_msgs/msg/JointTrajectoryPoint"]
    Bool = store.types["std_msgs/msg/Bool"]
    empty = np.zeros(0)
    with Writer(path, version=9, storage_plugin=plugin) as w:
        conns = {arm: (w.add_connection(f"/{arm}/joint_states", JointState.__msgtype__, typestore=store),
                       w.add_connection(f"/{arm}/arm_controller/joint_trajectory", Traj.__msgtype__, typestore=store))
                 for arm in ("left", "right")}
        split = w.add_connection("/episode", Bool.__msgtype__, typestore=store)
        events = [(k / 100, "state", 0) for k in range(int(seconds * 100) + 1)]
        events += [(k / 50 + 0.003, "command", 0) for k in range(int(seconds * 50))]
        if split_at is not None:
            events.append((split_at, "split", 0))
        stamps: dict[str, list[int]] = {}
        if cameras:
            Image, Compressed = store.types["sensor_msgs/msg/Image"], store.types["sensor_msgs/msg/CompressedImage"]
            cams = {"raw": w.add_connection(RAW_CAM[0], Image.__msgtype__, typestore=store),
                    "jpeg": w.add_connection(JPEG_CAM[0], Compressed.__msgtype__, typestore=store)}
            stamps = {RAW_CAM[0]: [], JPEG_CAM[0]: []}
            events += [(RAW_CAM[1] + i / RAW_CAM[2], "raw", i) for i in range(int(seconds * RAW_CAM[2]))]
            events += [(JPEG_CAM[1] + i / JPEG_CAM[2], "jpeg", i) for i in range(int(seconds * JPEG_CAM[2]))]
            from robo_rl.data.codecs import JpegEncoder

            jpeg = JpegEncoder(*FRAME_HW)
        for t, kind, i in sorted(events):
            ns = int(round((T0 + t) * 1e9))
            header = Header(stamp=Time(sec=int(T0 + t), nanosec=int(round((T0 + t) % 1 * 1e9))), frame_id="")
            if kind == "split":
                w.write(split, ns, store.serialize_cdr(Bool(data=True), Bool.__msgtype__))
                continue
            if kind == "raw":  # bgr8, rows padded to a step of 200 bytes as some drivers do
                bgr = np.zeros((FRAME_HW[0], 200), np.uint8)
                bgr[:, :3 * FRAME_HW[1]] = np.tile(frame_colour(0, i)[::-1], FRAME_HW[1])
                msg = Image(header=header, height=FRAME_HW[0], width=FRAME_HW[1], encoding="bgr8", is_bigendian=0,
                            step=200, data=bgr.reshape(-1))
                w.write(cams["raw"], ns, store.serialize_cdr(msg, Image.__msgtype__))
                stamps[RAW_CAM[0]].append(ns)
                continue
            if kind == "jpeg":
                data = jpeg.encode(np.full((*FRAME_HW, 3), frame_colour(1, i), np.uint8)) if i != bad_jpeg_at else b"\xff\xd8junk"
                msg = Compressed(header=header, format="rgb8; jpeg compressed bgr8", data=np.frombuffer(data, np.uint8))
                w.write(cams["jpeg"], ns, store.serialize_cdr(msg, Compressed.__msgtype__))
                stamps[JPEG_CAM[0]].append(ns)
                continue
            for a, arm in enumerate(("left", "right")):
                if kind == "state":
                    pos = np.array([joint_value(a, j, t) for j in range(7)])
                    msg = JointState(header=header, name=list(JOINTS), position=pos, velocity=np.zeros(7), effort=empty)
                    w.write(conns[arm][0], ns, store.serialize_cdr(msg, JointState.__msgtype__))
                else:  # the command: where the joints should be 0.1 s later
                    pos = np.array([joint_value(a, j, t + 0.1) for j in range(7)])
                    msg = Traj(header=header, joint_names=list(JOINTS),
                               points=[Point(positions=pos, velocities=empty, accelerations=empty, effort=empty,
                                             time_from_start=Duration(sec=0, nanosec=20_000_000))])
                    w.write(conns[arm][1], ns, store.serialize_cdr(msg, Traj.__msgtype__))
    return stamps


def _cli(*args):
    env = {**os.environ, "TQDM_DISABLE": "1"}
    return subprocess.run([sys.executable, "-m", "robo_rl.cli.main", *args], capture_output=True, text=True, timeout=300,
                          env=env, cwd=Path(__file__).parents[1])


@pytest.mark.parametrize("plugin", [StoragePlugin.MCAP, StoragePlugin.SQLITE3], ids=["mcap", "sqlite3"])
def test_a_bag_imports_with_the_right_values(tmp_path, plugin):
    bag, out = tmp_path / "bag", tmp_path / "store"
    write_bag(bag, plugin)
    r = _cli("dataset", "import-bag", str(bag), str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    spec = RobotSpec.from_yaml("aloha")
    store = EpisodeStore.open(out)
    assert store.n_episodes == 1 and store.schema.fps == 50
    ep = store.episode(0)
    t = ep["timestamp"] + 0.003  # steps start at the first command (0.003 s), every 20 ms
    assert np.allclose(np.diff(ep["timestamp"]), 0.02)
    for a in range(2):
        for j in range(7):
            i = 7 * a + j
            expect = joint_value(a, j, t)
            if i in spec.grippers:  # finger metres -> 0..1
                g = spec.grippers[i]
                expect = (expect - g.closed) / (g.open - g.closed)
            np.testing.assert_allclose(ep["obs/qpos"][:, i], expect, atol=1e-5)
    # the action at each step is the newest command at or before it: sent at 0.003 + 0.02 k, aimed 0.1 s ahead
    np.testing.assert_allclose(ep["action"][:, 1], joint_value(0, 1, t + 0.1), atol=1e-5)
    assert store.metas[0].source == "rosbag2:bag"


def test_split_topic_next_qpos_and_bad_input(tmp_path):
    bag = tmp_path / "bag"
    write_bag(bag, StoragePlugin.MCAP, seconds=3.0, split_at=1.5)
    r = _cli("dataset", "import-bag", str(bag), str(tmp_path / "split"), "split_topic=/episode", "action_from=next_qpos")
    assert r.returncode == 0, r.stderr
    store = EpisodeStore.open(tmp_path / "split")
    assert store.n_episodes == 2
    ep = store.episode(0)
    np.testing.assert_allclose(ep["action"][:-1], ep["obs/qpos"][1:])
    # bad input: one line, and nothing left behind
    r = _cli("dataset", "import-bag", str(tmp_path / "nope"), str(tmp_path / "x"))
    assert r.returncode == 2 and "does not exist" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "metadata.yaml").write_text("not: a bag\n")
    r = _cli("dataset", "import-bag", str(tmp_path / "junk"), str(tmp_path / "y"))
    assert r.returncode == 2 and "cannot read as a rosbag2" in r.stderr
    r = _cli("dataset", "import-bag", str(bag), str(tmp_path / "z"), "split_topic=/nothing")
    assert r.returncode == 2 and "no topic /nothing" in r.stderr
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists() and not (tmp_path / "z").exists()
    assert not list(tmp_path.glob("*.importing"))


def test_image_topics_import_as_the_newest_frame_at_each_step(tmp_path):
    bag = tmp_path / "bag"
    stamps = write_bag(bag, StoragePlugin.MCAP, seconds=1.5, cameras=True)
    # the robot description's ros2.cameras by default: /cam_high/image_raw is `top`; the JPEG topic is not in it
    r = _cli("dataset", "import-bag", str(bag), str(tmp_path / "default"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert EpisodeStore.open(tmp_path / "default").schema.cameras == ["top"]
    # named on the command line: both, each must be in the bag
    r = _cli("dataset", "import-bag", str(bag), str(tmp_path / "store"),
             f"image_topics={{{RAW_CAM[0]}:top,{JPEG_CAM[0]}:left_wrist}}")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "cameras left_wrist, top" in r.stdout
    store = EpisodeStore.open(tmp_path / "store")
    ep = store.episode(0)
    assert store.schema.keys["obs/images/top"].shape == (*FRAME_HW, 3)
    assert ep["obs/images/top"].dtype == np.uint8 and ep["obs/images/left_wrist"].shape == (len(ep["timestamp"]), *FRAME_HW, 3)
    # steps start once every camera has a frame (the JPEG camera's first, at 0.02 s), every 20 ms
    t = JPEG_CAM[1] + ep["timestamp"]
    np.testing.assert_allclose(ep["obs/qpos"][:, 1], joint_value(0, 1, t), atol=1e-5)
    for cam, (topic, _, _), tol in ((0, RAW_CAM, 0), (1, JPEG_CAM, 4)):
        key = "obs/images/top" if cam == 0 else "obs/images/left_wrist"
        for k, tk in enumerate(t):
            step_ns = int(round((T0 + tk) * 1e9))
            newest = max(i for i, ns in enumerate(stamps[topic]) if ns <= step_ns + 1)  # held until the next frame
            got = ep[key][k].reshape(-1, 3).mean(0)
            assert np.abs(got - frame_colour(cam, newest)).max() <= tol + 1e-9, (key, k, newest, got)


def test_a_frame_that_does_not_decode_leaves_nothing_behind(tmp_path):
    bag = tmp_path / "bag"
    write_bag(bag, StoragePlugin.SQLITE3, seconds=1.0, cameras=True, bad_jpeg_at=10)
    r = _cli("dataset", "import-bag", str(bag), str(tmp_path / "out"), f"image_topics={{{JPEG_CAM[0]}:left_wrist}}")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert f"{JPEG_CAM[0]} at " in r.stderr and "does not decode" in r.stderr
    r2 = _cli("dataset", "import-bag", str(bag), str(tmp_path / "out"), "image_topics={/nothing:top}")
    assert r2.returncode == 2 and "no topic /nothing" in r2.stderr
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob("*.importing"))
    # overwrite=true onto an existing store: the failed import leaves the old one as it was
    schema = small_schema(cameras=False)
    with EpisodeStore.create(tmp_path / "out", schema) as old:
        old.add_episode(*make_episode(0, schema))
    r3 = _cli("dataset", "import-bag", str(bag), str(tmp_path / "out"), f"image_topics={{{JPEG_CAM[0]}:left_wrist}}",
              "overwrite=true")
    assert r3.returncode == 2 and "does not decode" in r3.stderr and len(r3.stderr.strip().splitlines()) == 1, r3.stderr
    with EpisodeStore.open(tmp_path / "out") as store:
        assert store.n_episodes == 1 and store.schema.to_json() == schema.to_json() and store.validate() == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bag", "out"]  # no out.importing, no out.old-*


def write_shared_bag(path: Path, robot: str, seconds: float = 1.0, command_size: int | None = None) -> None:
    """A bag as ros2_control's defaults record it: every joint on /joint_states (the description's
    names), and the commands on the description's one command topic (forward: the values in the
    declared order; trajectory: all joints named). `command_size` writes forward commands of
    another size, as a wrong description would have sent them."""
    from robo_rl.hardware.ros2.robot import Ros2Config

    spec = RobotSpec.from_yaml(robot)
    ros = Ros2Config.from_yaml(robot, spec)
    (states,), (command,) = ros.states, ros.commands
    store = get_typestore(Stores.ROS2_HUMBLE)
    JointState, Header, Time = (store.types[t] for t in ("sensor_msgs/msg/JointState", "std_msgs/msg/Header",
                                                          "builtin_interfaces/msg/Time"))
    Traj, Point = store.types["trajectory_msgs/msg/JointTrajectory"], store.types["trajectory_msgs/msg/JointTrajectoryPoint"]
    Duration, Floats = store.types["builtin_interfaces/msg/Duration"], store.types["std_msgs/msg/Float64MultiArray"]
    Layout = store.types["std_msgs/msg/MultiArrayLayout"]
    empty = np.zeros(0)
    msgtype = Traj.__msgtype__ if command.type == "trajectory" else Floats.__msgtype__
    with Writer(path, version=9, storage_plugin=StoragePlugin.MCAP) as w:
        sc = w.add_connection(states.topic, JointState.__msgtype__, typestore=store)
        cc = w.add_connection(command.topic, msgtype, typestore=store)
        events = sorted([(k / 100, "state") for k in range(int(seconds * 100) + 1)] +
                        [(k / 50 + 0.003, "command") for k in range(int(seconds * 50))])
        for t, kind in events:
            ns = int(round((T0 + t) * 1e9))
            header = Header(stamp=Time(sec=int(T0 + t), nanosec=int(round((T0 + t) % 1 * 1e9))), frame_id="")
            wire = np.array([joint_value(i // 7, i % 7, t + (0.1 if kind == "command" else 0.0)) for i in range(14)])
            if kind == "state":  # names in another order than the action's: matched by name
                order = np.arange(14)[::-1]
                msg = JointState(header=header, name=[states.joints[i] for i in order], position=wire[order],
                                 velocity=np.zeros(14), effort=empty)
                w.write(sc, ns, store.serialize_cdr(msg, JointState.__msgtype__))
            elif command.type == "trajectory":
                msg = Traj(header=header, joint_names=list(command.joints),
                           points=[Point(positions=wire, velocities=empty, accelerations=empty, effort=empty,
                                         time_from_start=Duration(sec=0, nanosec=20_000_000))])
                w.write(cc, ns, store.serialize_cdr(msg, msgtype))
            else:
                msg = Floats(layout=Layout(dim=[], data_offset=0), data=wire[:command_size or 14])
                w.write(cc, ns, store.serialize_cdr(msg, msgtype))


@pytest.mark.parametrize("robot", ["aloha_shared_forward", "aloha_shared_trajectory"])
def test_a_bag_of_a_robot_with_one_joint_state_and_one_command_topic_imports(tmp_path, robot):
    bag, out = tmp_path / "bag", tmp_path / "store"
    write_shared_bag(bag, robot)
    r = _cli("dataset", "import-bag", str(bag), str(out), f"robot={robot}")
    assert r.returncode == 0, r.stdout + r.stderr
    spec = RobotSpec.from_yaml(robot)
    ep = EpisodeStore.open(out).episode(0)
    t = ep["timestamp"] + 0.003
    for i in range(14):
        expect_q, expect_a = joint_value(i // 7, i % 7, t), joint_value(i // 7, i % 7, t + 0.1)
        if i in spec.grippers:  # the description's wire unit -> 0..1
            expect_q, expect_a = spec.grippers[i].from_wire(expect_q), spec.grippers[i].from_wire(expect_a)
        np.testing.assert_allclose(ep["obs/qpos"][:, i], expect_q, atol=1e-5, err_msg=spec.joint_names[i])
        np.testing.assert_allclose(ep["action"][:, i], expect_a, atol=1e-5, err_msg=spec.joint_names[i])


def test_a_bag_whose_commands_do_not_match_the_description_is_one_line(tmp_path):
    write_shared_bag(tmp_path / "bag", "aloha_shared_forward", command_size=7)
    r = _cli("dataset", "import-bag", str(tmp_path / "bag"), str(tmp_path / "out"), "robot=aloha_shared_forward")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "/forward_position_controller/commands have 7 values" in r.stderr and "declares 14 joints" in r.stderr
