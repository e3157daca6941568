"""How the twin's room looks: the light, where each camera sits, the table's and the objects'
colours, and a distractor on the table. None of it touches the physics: the same actions from the
same seed give the same motion in every room; only the rendered frames change.

Two uses:
- **Shifts** (`parse_shifts`): named, fixed changes of the room for `robo-rl eval shifts=[...]`,
  the robustness report. Each is one `Room`, evaluated on the same seeds as the nominal room.
- **Randomised rendering** (`RoomRandomizer`): a new room drawn at every episode's reset, for
  `collect` and RaC's rollouts, so the demos themselves show the policy many rooms.

`RoomControl` applies a `Room` to a compiled MuJoCo model, always from the nominal values it saved
when it was made, so rooms never accumulate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from robo_rl.errors import ConfigError

DISTRACTOR = "distractor"  # the mocap body the twin adds when a room may hold a distractor
DISTRACTOR_RGBA = (0.15, 0.55, 0.5, 1.0)  # teal: no task object has this colour
DISTRACTOR_COLOURS = {"teal": DISTRACTOR_RGBA[:3], "yellow": (0.9, 0.8, 0.2), "grey": (0.5, 0.5, 0.5)}
DISTRACTOR_PLACES = ("anywhere", "aside")  # aside: in a band at the table's front or back, off the objects' rows
DISTRACTOR_SIZE = (0.03, 0.045)  # a cylinder, radius and half-height (m): a mug's size
TABLE_COLOURS = {"blue": (0.42, 0.5, 0.62), "green": (0.35, 0.5, 0.35), "grey": (0.55, 0.55, 0.55),
                 "white": (0.85, 0.85, 0.82), "dark": (0.2, 0.18, 0.16)}


@dataclass(frozen=True)
class CameraPose:
    """A camera moved from where the scene puts it: `move_cm` sideways (along the image's x axis)
    and `tilt_deg` about that axis (pitch)."""

    camera: str
    move_cm: float = 0.0
    tilt_deg: float = 0.0


@dataclass(frozen=True)
class Room:
    name: str = "nominal"
    light: float = 1.0                          # every light and the headlight, times this (the renderer clips at white)
    exposure: float = 1.0                       # every rendered frame's pixels, times this, clipped: a camera's own gain
    light_turn_deg: float = 0.0                 # the scene lights' directions turned about the vertical
    cameras: tuple[CameraPose, ...] = ()
    table_rgb: tuple[float, float, float] | None = None  # a plain colour instead of the table's texture
    object_hue_deg: float = 0.0                 # the task objects' colours turned round the hue circle
    distractor: bool = False                    # a mug-sized cylinder on the table, away from the task's objects
    distractor_colour: str = "teal"             # a key of DISTRACTOR_COLOURS
    distractor_place: str = "anywhere"          # a value of DISTRACTOR_PLACES

    def describe(self) -> str:
        parts = []
        if self.light != 1.0:
            parts.append(f"light {self.light:.3g}x")
        if self.exposure != 1.0:
            parts.append(f"exposure {self.exposure:.3g}x")
        if self.light_turn_deg:
            parts.append(f"light turned {self.light_turn_deg:+.0f} deg")
        for c in self.cameras:
            if c.move_cm:
                parts.append(f"{c.camera} camera moved {c.move_cm:+.1f} cm")
            if c.tilt_deg:
                parts.append(f"{c.camera} camera tilted {c.tilt_deg:+.1f} deg")
        if self.table_rgb is not None:
            parts.append("table " + next((k for k, v in TABLE_COLOURS.items() if v == self.table_rgb),
                                         "rgb(" + ",".join(f"{v:.2f}" for v in self.table_rgb) + ")"))
        if self.object_hue_deg:
            parts.append(f"objects' hue {self.object_hue_deg:+.0f} deg")
        if self.distractor:
            parts.append(f"a {self.distractor_colour} distractor on the table"
                         + (", aside" if self.distractor_place == "aside" else ""))
        return ", ".join(parts) or "as recorded"


# ---------------------------------------------------------------------------------------- shifts
SHIFT_GROUPS = {
    "light": ["light:0.6", "light:1.5"],
    "camera": ["camera_move:top:1", "camera_tilt:top:2"],
    "table": ["table:blue"],
    "distractor": ["distractor"],
    "light_curve": [f"light:{x:g}" for x in (0.4, 0.6, 0.8, 1.25, 1.5, 2.0)],
    "camera_curve": [f"camera_move:top:{x:g}" for x in (0.5, 1, 2, 3)],
}
SHIFT_FORMS = ("light:X", "exposure:X", "camera_move:CAMERA:CM", "camera_tilt:CAMERA:DEG", "table:COLOUR",
               "distractor[:aside][:COLOUR]")


def known_shifts() -> str:
    return (", ".join(SHIFT_GROUPS) + "; or one of " + ", ".join(SHIFT_FORMS)
            + f" (table COLOUR: {', '.join(TABLE_COLOURS)}; distractor COLOUR: {', '.join(DISTRACTOR_COLOURS)})")


def parse_shifts(names: Sequence[str], cameras: Sequence[str]) -> list[Room]:
    """The rooms named by `names` (groups expand to their conditions), in order, each once.
    `cameras`: the ones the policy sees; a camera shift for another camera is refused, since the
    policy could not show it."""
    rooms: dict[str, Room] = {}
    for raw in names:
        name = str(raw).strip()
        for cond in SHIFT_GROUPS.get(name, [name]):
            room = _parse_one(cond, cameras)
            rooms.setdefault(room.name, room)
    return list(rooms.values())


def _parse_one(cond: str, cameras: Sequence[str]) -> Room:
    kind, *args = cond.split(":")

    def number(text: str, what: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise ConfigError(f"shift {cond!r}: {what} {text!r} is not a number") from None
        if not math.isfinite(value):
            raise ConfigError(f"shift {cond!r}: {what} must be finite")
        return value

    if kind in ("light", "exposure") and len(args) == 1:  # Room's fields of the same names
        x = number(args[0], f"the {kind}'s factor")
        if x <= 0:
            raise ConfigError(f"shift {cond!r}: the {kind}'s factor must be > 0")
        return Room(name=cond, **{kind: x})
    if kind in ("camera_move", "camera_tilt") and len(args) in (1, 2):
        camera = args[0] if len(args) == 2 else "top"
        if camera not in cameras:
            raise ConfigError(f"shift {cond!r}: the policy does not see camera {camera!r} "
                              f"(its cameras: {', '.join(cameras) or 'none'})")
        value = number(args[-1], "the amount")
        pose = CameraPose(camera, move_cm=value) if kind == "camera_move" else CameraPose(camera, tilt_deg=value)
        return Room(name=cond, cameras=(pose,))
    if kind == "table" and len(args) <= 1:
        colour = args[0] if args else "blue"
        if colour not in TABLE_COLOURS:
            raise ConfigError(f"shift {cond!r}: unknown table colour {colour!r}; choose one of {', '.join(TABLE_COLOURS)}")
        return Room(name=f"table:{colour}", table_rgb=TABLE_COLOURS[colour])
    if kind == "distractor" and len(args) <= 2:
        places = [a for a in args if a in DISTRACTOR_PLACES]
        colours = [a for a in args if a in DISTRACTOR_COLOURS]
        if len(places) > 1 or len(colours) > 1 or len(places) + len(colours) != len(args):
            raise ConfigError(f"shift {cond!r}: write distractor[:aside][:COLOUR], COLOUR one of "
                              f"{', '.join(DISTRACTOR_COLOURS)}")
        return Room(name=cond, distractor=True, distractor_colour=colours[0] if colours else "teal",
                    distractor_place=places[0] if places else "anywhere")
    raise ConfigError(f"unknown shift {cond!r}; known: {known_shifts()}")


# ----------------------------------------------------------------------- randomised rendering
@dataclass(frozen=True)
class RoomRandomizer:
    """Draws a room per episode. The ranges are wider than the report's shifts at their centre,
    so those shifts lie inside what the demos show. Light factors are drawn log-uniformly."""

    light: tuple[float, float] = (0.5, 1.8)
    light_turn_deg: float = 30.0
    camera_move_cm: float = 1.5
    camera_tilt_deg: float = 3.0
    table_p: float = 0.5          # the chance of a plain table of a random colour
    object_hue_deg: float = 20.0
    distractor_p: float = 0.3

    def draw(self, rng: np.random.Generator, cameras: Sequence[str]) -> Room:
        lo, hi = np.log(self.light)
        poses = tuple(CameraPose(c, float(rng.uniform(-self.camera_move_cm, self.camera_move_cm)),
                                 float(rng.uniform(-self.camera_tilt_deg, self.camera_tilt_deg))) for c in cameras)
        table = tuple(float(v) for v in rng.uniform(0.15, 0.85, 3)) if rng.random() < self.table_p else None
        return Room(name="random", light=float(np.exp(rng.uniform(lo, hi))),
                    light_turn_deg=float(rng.uniform(-self.light_turn_deg, self.light_turn_deg)), cameras=poses,
                    table_rgb=table, object_hue_deg=float(rng.uniform(-self.object_hue_deg, self.object_hue_deg)),
                    distractor=bool(rng.random() < self.distractor_p))


def randomizer_option(value: object, where: str, cameras_missing: str | None) -> RoomRandomizer | None:
    """The `randomize_room=` option of a verb, checked in one line each: a boolean, and only where
    cameras exist to see the room (`cameras_missing`: what to say when they do not; None: they do)."""
    if not isinstance(value, bool):
        raise ConfigError(f"{where}: randomize_room={value!r}; choose true or false")
    if value and cameras_missing is not None:
        raise ConfigError(f"{where}: randomize_room=true changes only what cameras see; {cameras_missing}")
    return RoomRandomizer() if value else None


def room_rng(seed: int | None, salt: int = 0x50_0A) -> np.random.Generator:
    """A room's own random stream, from the episode's seed: drawing a room never moves the task's
    draws, so an episode starts from the same scene in every room."""
    return np.random.default_rng([salt, 0 if seed is None else int(seed)])


# ------------------------------------------------------------------------- applying a room
def add_distractor(spec) -> None:
    """Give a scene (an mujoco.MjSpec) the distractor's body: a mocap cylinder that never collides
    (contype and conaffinity 0), so the physics is the same with or without it. It waits under the
    floor until a room places it."""
    import mujoco

    body = spec.worldbody.add_body(name=DISTRACTOR, pos=[0, 0, -2], mocap=True)
    body.add_geom(name=DISTRACTOR, type=mujoco.mjtGeom.mjGEOM_CYLINDER, size=[*DISTRACTOR_SIZE, 0],
                  rgba=list(DISTRACTOR_RGBA), contype=0, conaffinity=0, group=1)


class RoomControl:
    """Applies rooms to one compiled model (and its data, for the distractor's place)."""

    def __init__(self, model) -> None:
        import mujoco

        self.model = m = model
        head = m.vis.headlight
        self._nominal = {
            "light": (m.light_diffuse.copy(), m.light_ambient.copy(), m.light_specular.copy(), m.light_dir.copy()),
            "head": (np.array(head.ambient), np.array(head.diffuse), np.array(head.specular)),
            "cam": (m.cam_pos.copy(), m.cam_quat.copy()),
            "geom": (m.geom_rgba.copy(), m.geom_matid.copy()),
        }
        self.table = mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_GEOM, "table")
        free_bodies = {int(m.jnt_bodyid[j]) for j in range(m.njnt) if m.jnt_type[j] == mujoco.mjtJoint.mjJNT_FREE}
        self.object_geoms = [g for g in range(m.ngeom) if int(m.geom_bodyid[g]) in free_bodies]
        self.free_bodies = sorted(free_bodies)
        body = mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_BODY, DISTRACTOR)
        self.distractor_mocap = int(m.body_mocapid[body]) if body >= 0 else -1
        self.distractor_geom = mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_GEOM, DISTRACTOR)

    def apply(self, room: Room, data=None, rng: np.random.Generator | None = None) -> None:
        """Set the model to `room`, from the nominal values. With `data` and `rng`, the distractor
        (when the room has one) is placed on the table, at least 10 cm from every task object."""
        import mujoco

        m, nom = self.model, self._nominal
        diffuse, ambient, specular, direction = nom["light"]
        m.light_diffuse[:] = diffuse * room.light
        m.light_ambient[:] = ambient * room.light
        m.light_specular[:] = specular * room.light
        m.light_dir[:] = _turn_about_z(direction, room.light_turn_deg)
        head = m.vis.headlight
        head.ambient[:], head.diffuse[:], head.specular[:] = (v * room.light for v in nom["head"])
        m.cam_pos[:], m.cam_quat[:] = (v.copy() for v in nom["cam"])
        for pose in room.cameras:
            cam = mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_CAMERA, pose.camera)
            if cam < 0:
                raise ConfigError(f"room {room.name!r}: the scene has no camera {pose.camera!r}")
            rot = np.zeros(9)
            mujoco.mju_quat2Mat(rot, m.cam_quat[cam])
            m.cam_pos[cam] += rot.reshape(3, 3)[:, 0] * pose.move_cm / 100  # the image's x axis, in the parent's frame
            turn = np.zeros(4)
            mujoco.mju_axisAngle2Quat(turn, np.array([1.0, 0, 0]), math.radians(pose.tilt_deg))
            quat = np.zeros(4)
            mujoco.mju_mulQuat(quat, m.cam_quat[cam].copy(), turn)
            m.cam_quat[cam] = quat
        rgba, matid = nom["geom"]
        m.geom_rgba[:], m.geom_matid[:] = rgba, matid
        if room.table_rgb is not None and self.table >= 0:
            m.geom_matid[self.table] = -1
            m.geom_rgba[self.table, :3] = room.table_rgb
        if room.object_hue_deg:
            for g in self.object_geoms:
                m.geom_rgba[g, :3] = _turn_hue(rgba[g, :3], room.object_hue_deg)
        if room.distractor and self.distractor_mocap < 0:
            raise ConfigError(f"room {room.name!r} has a distractor, but the scene was built without its body")
        if room.distractor:
            m.geom_rgba[self.distractor_geom, :3] = DISTRACTOR_COLOURS[room.distractor_colour]
        if data is not None and self.distractor_mocap >= 0:
            data.mocap_pos[self.distractor_mocap] = (self._distractor_place(data, rng, room.distractor_place)
                                                     if room.distractor else (0.0, 0.0, -2.0))

    def _distractor_place(self, data, rng: np.random.Generator | None, place: str = "anywhere") -> np.ndarray:
        rng = rng if rng is not None else np.random.default_rng(0)
        objects = np.array([data.xpos[b, :2] for b in self.free_bodies]).reshape(-1, 2)
        for _ in range(200):
            # aside: 18-25 cm off the table's middle row, where the tasks' objects start (|y| <= 12 cm) and meet
            x = rng.uniform(-0.3, 0.3)
            y = rng.uniform(-0.25, 0.25) if place == "anywhere" else rng.choice([-1, 1]) * rng.uniform(0.18, 0.25)
            xy = np.array([x, y])
            if not len(objects) or np.min(np.linalg.norm(objects - xy, axis=1)) >= 0.10:
                break
        return np.array([xy[0], xy[1], DISTRACTOR_SIZE[1]])


def _turn_about_z(directions: np.ndarray, degrees: float) -> np.ndarray:
    c, s = math.cos(math.radians(degrees)), math.sin(math.radians(degrees))
    out = directions.copy()
    out[:, 0] = c * directions[:, 0] - s * directions[:, 1]
    out[:, 1] = s * directions[:, 0] + c * directions[:, 1]
    return out


def _turn_hue(rgb: np.ndarray, degrees: float) -> np.ndarray:
    """`rgb` turned `degrees` round the hue circle, its lightness and saturation kept."""
    import colorsys

    h, lum, s = colorsys.rgb_to_hls(*[float(v) for v in rgb])
    return np.array(colorsys.hls_to_rgb((h + degrees / 360.0) % 1.0, lum, s))
