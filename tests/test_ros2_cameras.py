"""Cameras over ROS 2: the image messages' wire format, `robo-rl sim-bridge cameras=[...]` in another
process publishing frames that Ros2Robot receives (raw and JPEG), deploy's camera wiring, and
camera config errors."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml
from cyclonedds.idl import IdlStruct
from omegaconf import OmegaConf
from sim_bridge_proc import start_bridge, stop_bridge

from robo_rl.data.codecs import rgb_from_compressed, rgb_from_raw
from robo_rl.errors import ConfigError
from robo_rl.hardware.robot import HARDWARE_DIR
from robo_rl.hardware.ros2.dds import DdsTransport
from robo_rl.hardware.ros2.messages import CompressedImage, Header, Image, Time
from robo_rl.hardware.ros2.robot import Ros2Robot

ROOT = Path(__file__).parents[1]


def domain(k: int) -> int:
    """DDS domains of this module's own (200..229), k = 0..2 for its bridges, apart from other test files'."""
    return 200 + (os.getpid() % 10) * 3 + k


def twin_view(camera: str, qpos: np.ndarray, size=(240, 320)) -> np.ndarray:
    """What the twin's `camera` shows with the arms at `qpos`, rendered here."""
    from robo_rl.sim.robot import SimRobot

    sim = SimRobot(cameras=[camera], image_size=size)
    sim.set_joint_positions(qpos)
    img = sim.render()[camera]
    sim.close()
    return img


def mean_abs_diff(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a.astype(np.int16) - b.astype(np.int16)).mean())


def hold(robot: Ros2Robot, action: np.ndarray, seconds: float) -> None:
    for _ in range(int(seconds * 50)):
        robot.act(action)
        time.sleep(0.02)


# ---------------------------------------------------------------------------------------- wire


def test_image_messages_are_ros2_cdr_byte_for_byte():
    """Our fast path writes what CycloneDDS's generic serializer and ROS 2's own (rosbags) write."""
    from rosbags.typesys import Stores, get_typestore

    ros = get_typestore(Stores.ROS2_HUMBLE)
    RosImage, RosCompressed = ros.types["sensor_msgs/msg/Image"], ros.types["sensor_msgs/msg/CompressedImage"]
    RosHeader, RosTime = ros.types["std_msgs/msg/Header"], ros.types["builtin_interfaces/msg/Time"]
    assert Image.__idl_typename__ == "sensor_msgs::msg::dds_::Image_"
    pixels = np.random.default_rng(0).integers(0, 256, (5, 7, 3), dtype=np.uint8)
    for frame_id in ("", "a", "ab", "top", "caméra"):  # every padding before the fields that follow
        header = Header(Time(1_700_000_000, 123_456_789), frame_id)
        ros_header = RosHeader(stamp=RosTime(sec=1_700_000_000, nanosec=123_456_789), frame_id=frame_id)
        img = Image(header, 5, 7, "rgb8", 0, 21, pixels.tobytes())
        wire = img.serialize()
        assert wire == IdlStruct.serialize(img)
        assert wire == ros.serialize_cdr(RosImage(header=ros_header, height=5, width=7, encoding="rgb8", is_bigendian=0,
                                                  step=21, data=pixels.reshape(-1)), RosImage.__msgtype__)
        assert Image.deserialize(wire) == img
        jpeg = CompressedImage(header, "jpeg", b"\xff\xd8\x01\x02\x03")
        assert jpeg.serialize() == IdlStruct.serialize(jpeg)
        assert jpeg.serialize() == ros.serialize_cdr(
            RosCompressed(header=ros_header, format="jpeg", data=np.frombuffer(jpeg.data, np.uint8)), RosCompressed.__msgtype__)
        assert CompressedImage.deserialize(jpeg.serialize()) == jpeg
    # a big-endian writer's bytes read back the same
    from cyclonedds.idl._support import Endianness

    assert Image.deserialize(IdlStruct.serialize(img, endianness=Endianness.Big)) == img


def test_frames_decode_to_rgb_from_every_encoding():
    rgb = np.random.default_rng(1).integers(0, 256, (4, 6, 3), dtype=np.uint8)
    padded = np.zeros((4, 20), np.uint8)  # rows padded past 6 * 3 bytes, as some drivers send
    padded[:, :18] = rgb[..., ::-1].reshape(4, 18)
    np.testing.assert_array_equal(rgb_from_raw("bgr8", 4, 6, 20, padded.tobytes()), rgb)
    np.testing.assert_array_equal(rgb_from_raw("rgb8", 4, 6, 18, rgb.tobytes()), rgb)
    mono = rgb_from_raw("mono8", 4, 6, 6, rgb[..., 0].tobytes())
    assert mono.shape == (4, 6, 3) and (mono == rgb[..., :1]).all()
    from PIL import Image as PilImage
    import io

    png = io.BytesIO()
    PilImage.fromarray(rgb).save(png, format="PNG")
    np.testing.assert_array_equal(rgb_from_compressed(png.getvalue(), "png"), rgb)
    with pytest.raises(ConfigError, match="encoding 'yuv422' unsupported"):
        rgb_from_raw("yuv422", 4, 6, 12, bytes(48))
    with pytest.raises(ConfigError, match="needs step >= 18 and 72 bytes; it has 10"):
        rgb_from_raw("rgb8", 4, 6, 18, bytes(10))
    with pytest.raises(ConfigError, match="neither JPEG nor PNG"):
        rgb_from_compressed(b"GIF89a", "gif")


# ---------------------------------------------------------------------------------------- bridge -> Ros2Robot


def test_bridge_frames_reach_ros2robot_and_show_the_arm_move():
    dom = domain(0)
    bridge = start_bridge(dom, "cameras=[top]", "camera_hz=15")
    try:
        robot = Ros2Robot("aloha", DdsTransport(dom), cameras=["top"])
        robot.connect(timeout_s=20)
        obs = robot.observe()
        assert set(obs.images) == {"top"}
        first = obs.images["top"]
        assert first.shape == (240, 320, 3) and first.dtype == np.uint8
        assert first.reshape(-1, 3).std(0).min() > 5  # a scene, not one colour
        assert robot.camera_age_s()["top"] < 2.0  # streaming (15 Hz), with room for a stalled bridge
        # the frame is the twin's view at the state it reports
        assert mean_abs_diff(first, twin_view("top", obs.qpos)) < 2.0

        target = robot.spec.home.copy()
        target[0], target[7] = 0.6, -0.6  # both waists swing
        hold(robot, target, 1.5)
        obs = robot.observe()
        assert abs(obs.qpos[0] - 0.6) < 0.05
        moved = obs.images["top"]
        assert mean_abs_diff(moved, first) > 1.0, "the frame did not change when the arms moved"
        assert mean_abs_diff(moved, twin_view("top", obs.qpos)) < mean_abs_diff(moved, first) / 3

        # a camera the bridge does not publish: connect says which topic stayed silent, in one line
        quiet = Ros2Robot("aloha", DdsTransport(dom), cameras=["right_wrist"])
        with pytest.raises(ConfigError, match=r"^no camera frames on /cam_right_wrist/image_raw \(right_wrist\) within 3 s") as e:
            quiet.connect(timeout_s=3.0)  # room for discovery on a loaded machine: the joint states come first
        assert "\n" not in str(e.value)
        # cameras=None: every configured camera is read, none waited for; the silent ones stay out
        # (a second driver of the same arms: the first one's writers are allowed, it never commands)
        every = Ros2Robot("aloha", DdsTransport(dom), allow_other_writers=True)
        every.connect(timeout_s=20)
        deadline = time.monotonic() + 5
        while "top" not in every.observe().images and time.monotonic() < deadline:
            time.sleep(0.02)
        ages = every.camera_age_s()
        assert set(every.observe().images) == {"top"} and ages["top"] < 2.0 and ages["right_wrist"] == float("inf")
        # waiting for fresh state (the episode loop does, before its first tick) waits for the
        # cameras that stream, not for the silent one (which would time it out: False)
        assert every.wait_for_fresh(time.monotonic(), timeout_s=2.0)
        for r in (robot, quiet, every):
            r.close()
    finally:
        out = stop_bridge(bridge)
    assert "camera frames" in out and "commands received" in out.splitlines()[-1]


def test_jpeg_frames_and_deploy_resizing_to_the_policy(tmp_path):
    """The bridge publishes CompressedImage (image_type=compressed); a robot description reading JPEG
    (ros2.cameras.*.type: compressed) gets RGB frames, and deploy's make_robot resizes them to the
    image size a policy was trained at."""
    from robo_rl.cli.deploy import make_robot
    from robo_rl.policies import ObsShapes, make_policy

    desc = yaml.safe_load((HARDWARE_DIR / "aloha.yaml").read_text())
    for cam in desc["ros2"]["cameras"].values():
        cam["type"] = "compressed"
    jpeg_robot = tmp_path / "aloha_jpeg.yaml"
    jpeg_robot.write_text(yaml.safe_dump(desc))
    dom = domain(1)
    bridge = start_bridge(dom, "cameras=[top,left_wrist]", "image_type=compressed", "camera_hz=25")
    try:
        robot = Ros2Robot(jpeg_robot, DdsTransport(dom), cameras=["left_wrist"])
        robot.connect(timeout_s=20)
        obs = robot.observe()
        wrist = obs.images["left_wrist"]
        assert wrist.shape == (240, 320, 3) and wrist.reshape(-1, 3).std(0).min() > 5
        assert mean_abs_diff(wrist, twin_view("left_wrist", obs.qpos)) < 4.0  # JPEG's loss, no more
        robot.close()

        policy = make_policy("flow", {}, ObsShapes({"obs/qpos": 14}, {"obs/images/top": (96, 128)}, 14))
        cfg = OmegaConf.create({"robot": str(jpeg_robot), "domain_id": dom, "transport": "dds", "seed": 0})
        robot, _ = make_robot(cfg, policy, None)
        assert [c.name for c in robot.cameras] == ["top"]
        robot.connect(timeout_s=20)
        obs = robot.observe()
        assert set(obs.images) == {"top"} and obs.images["top"].shape == (96, 128, 3)
        assert mean_abs_diff(obs.images["top"], twin_view("top", obs.qpos, (96, 128))) < 6.0
        robot.close()

        # a camera the robot has no topic for: refused before anything connects
        desc["ros2"]["cameras"].pop("top")
        no_top = tmp_path / "aloha_no_top.yaml"
        no_top.write_text(yaml.safe_dump(desc))
        with pytest.raises(ConfigError, match=r"needs camera\(s\) \['top'\], which robot=.* has no ros2.cameras topic"):
            make_robot(OmegaConf.create({**cfg, "robot": str(no_top)}), policy, None)
    finally:
        stop_bridge(bridge)


@pytest.mark.slow  # 24 s (AMD EPYC, AVX2 only); frames over DDS stay in the default run (bridge frames, a camera policy deployed over DDS)
def test_record_full_frames_over_dds_then_train(tmp_path):
    """The whole path at small size: `sim-bridge` publishes two cameras at 480x640 (the robot
    description's size), `robo-rl record robot=aloha` stores them as JPEG (a real robot's default)
    with 48x64 copies for training, and `robo-rl train` learns from those copies."""
    from robo_rl.data.store import EpisodeStore

    import threading

    from robo_rl.hardware.robot import RobotSpec
    from robo_rl.hardware.ros2.messages import JointState

    dom = domain(2)
    env = {**os.environ, "MUJOCO_GL": "egl", "TQDM_DISABLE": "1"}
    bridge = start_bridge(dom, "cameras=[top,left_wrist]", "image_size=[480,640]", "camera_hz=15")
    # leader arms held at home, as their drivers would publish them (the human is not moving)
    home = RobotSpec.from_yaml("aloha").home.astype(float)
    joints = ["waist", "shoulder", "elbow", "forearm_roll", "wrist_angle", "wrist_rotate", "gripper"]
    transport = DdsTransport(dom)
    publish = {arm: transport.publisher(f"/leader_{arm}/joint_states", JointState, qos="sensor") for arm in ("left", "right")}
    done = threading.Event()

    def leader() -> None:
        while not done.wait(0.01):
            for k, arm in enumerate(("left", "right")):
                publish[arm](JointState(Header(Time.now()), joints, list(home[7 * k:7 * k + 7]), [0.0] * 7, []))

    threading.Thread(target=leader, daemon=True).start()
    try:
        store = tmp_path / "demos"
        run = subprocess.run([sys.executable, "-m", "robo_rl.cli.main", "record", "robot=aloha", "teleop=leader",
                              f"domain_id={dom}", "transport=dds", f"out={store}", "cameras=[top,left_wrist]",
                              "image_size=[48,64]", "auto_start=true", "episodes=2", "episode_s=1.5", "task=transfer_cube"],
                             capture_output=True, text=True, env=env, timeout=240, stdin=subprocess.DEVNULL)
    finally:
        done.set()
        stop_bridge(bridge)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "2 episode(s) committed" in run.stdout, run.stdout
    with EpisodeStore.open(store) as demos:
        assert demos.image_codec == "jpeg" and demos.train_image_size == (48, 64)
        assert demos.schema.keys["obs/images/top"].shape == (480, 640, 3)
        full = demos.read("obs/images/top", 0, 1)[0]
        assert full.reshape(-1, 3).std(0).min() > 5  # a picture of the scene, not a blank
        assert min(demos.image_psnr().values()) > 30  # what JPEG lost, measured as it was written
        # a 15 fps camera read at 50 Hz: most steps repeat the previous frame, stored once
        repeat = demos._read_rows("repeat/obs/images/top", slice(0, demos.n_steps))
        assert (repeat > 0).mean() > 0.3
        assert demos.validate() == []
    train = subprocess.run([sys.executable, "-m", "robo_rl.cli.main", "train", "policy=flow", "task=transfer_cube",
                            f"dataset={store}", f"run_dir={tmp_path / 'run'}", "learner.steps=5", "learner.batch_size=8",
                            "eval.episodes=0", "policy.dit_dim=32", "policy.dit_depth=2", "policy.image_encoder=conv",
                            "policy.n_obs=1", "obs_keys=[obs/qpos,obs/images/top]", "recipe=none"],
                           capture_output=True, text=True, env=env, timeout=240)
    assert train.returncode == 0, train.stdout + train.stderr
    from robo_rl.policies import load_policy, read_checkpoint

    policy = load_policy(read_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt"))
    assert policy.shapes.images == {"obs/images/top": (48, 64)}  # trained on the copies, not the full frames


# ---------------------------------------------------------------------------------------- config errors


@pytest.mark.parametrize("cameras, message", [
    ({"front": {"topic": "/cam/image_raw"}}, r"ros2\.cameras\.front: aloha has no camera 'front'"),
    ({"top": {"topic": "/cam_high/image_raw", "type": "h264"}}, r"ros2\.cameras\.top\.type='h264'; choose image"),
    ({"top": {"type": "image"}}, r"ros2\.cameras\.top\.topic=None; give the ROS topic"),
    ({"top": {"topic": "/a", "typ": "image"}}, r"ros2\.cameras\.top: unknown key\(s\) \['typ'\]"),
    ({"top": {"topic": "/a"}, "left_wrist": {"topic": "/a"}}, r"ros2\.cameras\.left_wrist\.topic=/a is another camera's"),
    (["top"], r"ros2\.cameras is a mapping of camera name"),
], ids=["unknown-camera", "bad-type", "no-topic", "typo", "shared-topic", "a-list"])
def test_a_bad_camera_config_is_a_one_line_error_naming_the_key(tmp_path, cameras, message):
    desc = yaml.safe_load((HARDWARE_DIR / "aloha.yaml").read_text())
    desc["ros2"]["cameras"] = cameras
    path = tmp_path / "robot.yaml"
    path.write_text(yaml.safe_dump(desc, sort_keys=False))
    with pytest.raises(ConfigError, match=message) as e:
        Ros2Robot(path, DdsTransport(domain(2)))
    assert "\n" not in str(e.value) and str(path) in str(e.value)


def test_the_cli_refuses_bad_camera_choices_in_one_line(tmp_path):
    env = {**os.environ, "MUJOCO_GL": "egl"}

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "robo_rl.cli.main", *args], capture_output=True, text=True,
                              timeout=120, env=env, cwd=ROOT)

    for args, message in ((["cameras=[front]"], "sim-bridge: camera(s) ['front'] have no topic"),
                          (["cameras=[top]", "camera_hz=0"], "camera_hz=0.0; give a rate in (0, 50]"),
                          (["cameras=[top]", "image_type=h264"], "image_type='h264'; choose image, compressed")):
        r = cli("sim-bridge", f"domain_id={domain(2)}", "duration=0", *args)
        assert r.returncode == 2 and message in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
