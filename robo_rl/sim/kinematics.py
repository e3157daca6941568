"""The arms' kinematic model for end-effector teleop (keyboard, gamepad, SpaceMouse) on real arms:
the MJCF or URDF named in the robot description's `kinematics:` section (MuJoCo loads both), never
simulated, only posed. Without that section the twin's model serves, as it matches ALOHA-like arms.

    kinematics:
      model: my_arms.urdf          # a path (relative to the description's folder), or a file in sim/
      arms:                        # per arm: its 6 joints in the model, in action order,
        left:  {joints: [...], end_effector: left_tool, base: left_base}   # the end effector
        right: {joints: [...], end_effector: right_tool, base: right_base} # (a site or a body; a
                                                                           # URDF has bodies only)
                                                                           # and the arm's base body
Leader arms need no model at all (robo_rl/sim/teleop.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import mujoco

from robo_rl.errors import ConfigError
from robo_rl.hardware.robot import RobotSpec, read_robot_yaml
from robo_rl.hardware.teleop import ARMS
from robo_rl.sim.robot import SIM_DIR


@dataclass(frozen=True)
class ArmFrames:
    joints: tuple[str, ...]   # the model's names of the arm's 6 joints, in action order
    end_effector: str         # a site or a body
    base: str                 # a body: where reach is measured from


class Kinematics:
    """What TeleopOperator reads of a SimRobot (`model`, `data`, `spec`), for a model that is only
    posed, plus `arms`: each arm's joints and frames in it."""

    def __init__(self, model: mujoco.MjModel, spec: RobotSpec, arms: dict[str, ArmFrames]):
        self.model, self.spec, self.arms = model, spec, arms
        self.data = mujoco.MjData(model)
        mujoco.mj_kinematics(model, self.data)  # bodies where qpos0 puts them (the bases' positions)


def load_kinematics(robot: str | Path) -> Kinematics | None:
    """The description's `kinematics:` model, or None when it names none (the twin's then serves)."""
    path, d = read_robot_yaml(robot)
    k = d.get("kinematics")
    if k is None:
        return None
    where = f"{path}: kinematics"
    if not isinstance(k, dict) or not isinstance(k.get("model"), str) or not isinstance(k.get("arms"), dict):
        raise ConfigError(f"{where} is a mapping {{model: FILE.urdf|FILE.xml, arms: {{left: ..., right: ...}}}}")
    model_path = path.parent / k["model"]
    if not model_path.is_file():
        model_path = SIM_DIR / k["model"]
    if not model_path.is_file():
        raise ConfigError(f"{where}.model={k['model']!r}: no such file beside {path.name} or in sim/")
    try:
        model = mujoco.MjModel.from_xml_path(str(model_path))
    except Exception as e:  # noqa: BLE001 - MuJoCo's compiler errors (URDF or MJCF): one line
        raise ConfigError(f"{where}.model: MuJoCo cannot load {model_path} ({str(e).splitlines()[0]})") from None
    arms = {}
    for arm in ARMS:
        a = k["arms"].get(arm)
        at = f"{where}.arms.{arm}"
        if not isinstance(a, dict) or set(a) != {"joints", "end_effector", "base"}:
            raise ConfigError(f"{at}: give joints (6 names), end_effector and base")
        joints = tuple(str(j) for j in a["joints"] or ())
        if len(joints) != 6:
            raise ConfigError(f"{at}.joints: give the arm's 6 joints in action order, got {list(joints)}")
        for j in joints:
            if mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_JOINT, j) < 0:
                raise ConfigError(f"{at}.joints: {model_path.name} has no joint {j!r}")
        ee, base = str(a["end_effector"]), str(a["base"])
        if mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_SITE, ee) < 0 and mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_BODY, ee) < 0:
            raise ConfigError(f"{at}.end_effector: {model_path.name} has no site or body {ee!r}")
        if mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_BODY, base) < 0:
            raise ConfigError(f"{at}.base: {model_path.name} has no body {base!r} (a URDF's fixed links are kept "
                              "only with <mujoco><compiler fusestatic=\"false\"/></mujoco> in it)")
        arms[arm] = ArmFrames(joints, ee, base)
    return Kinematics(model, RobotSpec.from_yaml(robot), arms)
