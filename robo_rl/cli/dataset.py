"""robo-rl dataset info|validate|repair|merge|filter|delete|import-bag|import-lerobot|export-lerobot|import-hdf5
PATH ... [key=value ...]"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from robo_rl.cli.app import quote_override_value, run_app
from robo_rl.cli.tables import human_bytes, print_table
from robo_rl.data.store import EpisodeStore
from robo_rl.errors import ConfigError

OPS = ("info", "validate", "repair", "merge", "filter", "delete", "import-bag", "import-lerobot", "export-lerobot",
       "import-hdf5")
FLAGS = {"--plots": "plots=true"}  # `info PATH --plots` reads better than plots=true


def main(argv: list[str]) -> int:
    # Positional words become overrides: `info PATH` -> op=info paths=['PATH'].
    argv = [FLAGS.get(a, a) for a in argv]
    positional = [a for a in argv if "=" not in a and not a.startswith("-")]
    rest = [a for a in argv if a not in positional]
    if positional and positional[0] in OPS:
        rest.append(f"op={positional.pop(0)}")
    elif positional and not any(a.startswith("op=") for a in rest):
        print(f"error: unknown dataset op '{positional[0]}'; ops are {', '.join(OPS)}", file=sys.stderr)
        return 2
    if positional:
        rest.append("paths=[" + ",".join(quote_override_value(p) for p in positional) + "]")
    return run_app("dataset", "dataset", run, rest)


def run(cfg: DictConfig) -> int:
    op = cfg.op
    paths = list(cfg.paths or [])
    if op not in OPS:
        raise ConfigError(f"op={op!r} unknown; ops are {', '.join(OPS)}")
    if not paths:
        raise ConfigError(f"dataset {op}: give the store path, e.g. robo-rl dataset {op} data/demos/transfer_cube")
    if op in ("info", "validate", "repair", "filter", "delete") and len(paths) != 1:
        raise ConfigError(f"dataset {op}: takes one store, got {len(paths)}: {paths}")
    return {"info": info, "validate": validate, "repair": repair, "merge": merge, "filter": filter_, "delete": delete,
            "import-bag": import_bag, "import-lerobot": import_lerobot, "export-lerobot": export_lerobot,
            "import-hdf5": import_hdf5}[op](cfg, paths)


def info(cfg: DictConfig, paths: list[str]) -> int:
    with EpisodeStore.open(paths[0]) as store:
        facts = store.info()
    if cfg.json:
        print(json.dumps(facts, indent=2, default=list))
    else:
        _print_info(facts)
    if cfg.plots:
        from robo_rl.data.plots import dataset_plots

        out = Path(cfg.out) if cfg.out else plots_dir(paths[0])
        with EpisodeStore.open(paths[0]) as store:
            written = dataset_plots(store, out)
        # with json=true stdout stays one JSON document: the note goes to stderr
        print(f"plots: {len(written)} PNG file(s) in {out}: " + ", ".join(p.name for p in written),
              file=sys.stderr if cfg.json else sys.stdout)
    return 0


def _print_info(facts: dict) -> None:
    succ = facts["success_rate"]
    rows = [
        ("episodes", facts["episodes"]),
        ("steps", facts["steps"]),
        ("duration", f"{facts['duration_s']:.1f} s"),
        ("fps", f"{facts['fps']:g}"),
        ("mean episode length", f"{facts['mean_length']:.1f} steps"),
        ("success rate", "n/a" if succ is None else f"{succ:.1%} of {facts['labelled_success']} labelled"),
        ("robot", facts["robot"]),
        ("tasks", ", ".join(t or "(none)" for t in facts["tasks"]) or "-"),
        ("cameras", ", ".join(facts["cameras"]) or "-"),
        ("image codec", facts["image_codec"] or "-"),
        *([("image loss (PSNR at write time, worst episode)",
            ", ".join(f"{cam} {db:.1f} dB" for cam, db in facts["image_psnr_db"].items()) or "-")]
          if facts.get("image_psnr_db") is not None else []),
        *([("training-size copies (what train reads)", "x".join(str(v) for v in facts["train_image_size"]))]
          if facts.get("train_image_size") else []),
        ("size on disk", human_bytes(facts["bytes_on_disk"])),
        ("schema version", facts["schema_version"]),
    ]
    print_table(f"{facts['location']}", ["", ""], rows)
    total = max(1, facts["steps"])
    print_table("steps per segment label", ["segment", "steps", "share"],
                [(k, v, f"{v / total:.1%}") for k, v in facts["segments"].items()])
    print_table("keys", ["key", "shape", "dtype"], [(k, str(s), d) for k, (s, d) in facts["keys"].items()])


def plots_dir(store_path: str) -> Path:
    """Where `info --plots` writes: beside the store, never inside it (the store is a zarr group)."""
    p = Path(store_path.rstrip("/"))
    return p.with_name(p.name + ".plots")


def validate(cfg: DictConfig, paths: list[str]) -> int:
    with EpisodeStore.open(paths[0]) as store:
        problems = store.validate()
        n = store.n_episodes
    if problems:
        for p in problems:
            print(f"problem: {p}")
        print(f"{paths[0]}: {len(problems)} problem(s) in a store of {n} committed episodes")
        return 1
    print(f"{paths[0]}: ok, {n} committed episodes, every check passed")
    return 0


def repair(cfg: DictConfig, paths: list[str]) -> int:
    with EpisodeStore.open(paths[0], mode="a") as store:
        report = store.repair()
    print(f"{paths[0]}: {report.summary()}")
    return 0


def _selection(cfg: DictConfig) -> dict:
    seg = cfg.segment
    if seg is not None and not isinstance(seg, str):
        seg = list(OmegaConf.to_container(seg))
    return {"task": cfg.task, "success": cfg.success, "segment": seg, "source": cfg.source}


def filter_(cfg: DictConfig, paths: list[str]) -> int:
    if not cfg.out:
        raise ConfigError("dataset filter: give out=PATH for the filtered store")
    with EpisodeStore.open(paths[0]) as store:
        keep = store.select(**_selection(cfg))
        with store.copy_episodes(cfg.out, keep, overwrite=cfg.overwrite) as dst:
            print(f"{cfg.out}: {dst.n_episodes} of {store.n_episodes} episodes ({dst.n_steps} steps) match")
    return 0


def merge(cfg: DictConfig, paths: list[str]) -> int:
    if not cfg.out:
        raise ConfigError("dataset merge: give out=PATH for the merged store")
    with EpisodeStore.merge(paths, cfg.out, overwrite=cfg.overwrite) as dst:
        print(f"{cfg.out}: merged {len(paths)} stores into {dst.n_episodes} episodes, {dst.n_steps} steps")
    return 0


def delete(cfg: DictConfig, paths: list[str]) -> int:
    if cfg.episodes is None:
        raise ConfigError("dataset delete: give episodes=[i,j,...] to remove")
    eps = [cfg.episodes] if isinstance(cfg.episodes, int) else list(cfg.episodes)
    with EpisodeStore.open(paths[0], mode="a") as store:
        before = store.n_episodes
        left = store.delete(eps)
    print(f"{paths[0]}: deleted {before - left} episode(s), {left} remain")
    return 0


def import_bag(cfg: DictConfig, paths: list[str]) -> int:
    """rosbag2 bags -> a new store, with the topics and joints of hardware/<robot>.yaml. Image
    topics: `image_topics={/topic:camera,...}` (each must be in every bag), else the robot's
    ros2.cameras (those in the bags)."""
    from robo_rl.data.rosbag import BagImport, TopicJoints, import_bags
    from robo_rl.hardware.robot import RobotSpec
    from robo_rl.hardware.ros2.robot import Ros2Config

    out = cfg.out or (paths.pop() if len(paths) >= 2 else None)
    if not out or not paths:
        raise ConfigError("dataset import-bag: give the bag(s) and where the store goes: import-bag BAG [BAG ...] OUT")
    spec = RobotSpec.from_yaml(cfg.robot)
    ros = Ros2Config.from_yaml(cfg.robot, spec)
    states = [TopicJoints(t.topic, t.joints, t.indices) for t in ros.states]
    commands = [TopicJoints(c.topic, c.joints, c.indices) for c in ros.commands]
    grippers = {i: (g.closed, g.open) for i, g in spec.grippers.items()}
    image_topics = cfg.image_topics
    if image_topics is None:
        images, required = {c.topic: c.name for c in ros.cameras}, False
    elif OmegaConf.is_dict(image_topics):
        images, required = {str(k): str(v) for k, v in image_topics.items()}, True
    else:
        raise ConfigError(f"dataset import-bag: image_topics={image_topics!r}; give a mapping of topic to camera, "
                          "e.g. image_topics={/cam_high/image_raw:top}, or {} for none")
    bag_cfg = BagImport(states, commands, spec.action_dim, float(cfg.fps), grippers, str(cfg.action_from), cfg.split_topic,
                        cfg.task or "", spec.name, images, required)
    store = import_bags(paths, out, bag_cfg, overwrite=bool(cfg.overwrite), train_image_size=_copy_size(cfg))
    cams = store.schema.cameras
    print(f"{out}: {store.n_episodes} episode(s), {store.n_steps} steps at {cfg.fps:g} fps from {len(paths)} bag(s)"
          + (f", cameras {', '.join(cams)}" if cams else "") + _copies_note(store))
    return 0


def _copy_size(cfg: DictConfig) -> tuple[int, int] | None:
    """image_size for the imports: [height, width] of the training-size copies, or null for none."""
    size = cfg.get("image_size")
    if size is None:
        return None
    try:
        h, w = (int(v) for v in size)
    except (TypeError, ValueError):
        raise ConfigError(f"dataset: image_size={size!r}; give [height, width], e.g. [96,96], or null for no copies") from None
    if h < 8 or w < 8:
        raise ConfigError(f"dataset: image_size=[{h}, {w}] must be at least 8 px a side")
    return h, w


def _copies_note(store) -> str:
    size = store.train_image_size
    return f" (full size, with {size[0]}x{size[1]} copies that train reads)" if size else ""


def _src_out(cfg: DictConfig, paths: list[str], op: str, usage: str) -> tuple[str, str]:
    """`op SRC OUT` or `op SRC out=OUT`: exactly one source and one destination."""
    if cfg.out and len(paths) == 1:
        return paths[0], str(cfg.out)
    if len(paths) == 2 and not cfg.out:
        return paths[0], paths[1]
    raise ConfigError(f"dataset {op}: give the source and where the result goes: {usage}")


def import_lerobot(cfg: DictConfig, paths: list[str]) -> int:
    """A local LeRobot dataset (format v2.1 or v3.0) -> a new store."""
    from robo_rl.data.lerobot import import_lerobot as run_import

    src, out = _src_out(cfg, paths, "import-lerobot", "import-lerobot LEROBOT_DIR OUT")
    with run_import(src, out, overwrite=bool(cfg.overwrite), robot=cfg.robot_name,
                    train_image_size=_copy_size(cfg)) as store:
        cams = store.schema.cameras
        print(f"{out}: {store.n_episodes} episode(s), {store.n_steps} steps at {store.schema.fps:g} fps from {src}"
              + (f", cameras {', '.join(cams)}" if cams else "") + _copies_note(store))
    return 0


def export_lerobot(cfg: DictConfig, paths: list[str]) -> int:
    """A store -> a LeRobot v3.0 dataset; camera frames are encoded and decoded back to measure the loss."""
    from robo_rl.data.lerobot_export import export_lerobot as run_export

    src, out = _src_out(cfg, paths, "export-lerobot", "export-lerobot STORE OUT_DIR")
    report = run_export(src, out, codec=str(cfg.codec), crf=int(cfg.crf), overwrite=bool(cfg.overwrite))
    rows = [(cam, report["codec"], f"{q['psnr_db']:.1f} dB", f"{q['max_abs_error']}", f"{q['mean_abs_error']:.2f}")
            for cam, q in report["image_loss"].items()]
    if rows:
        print_table("camera frames after encoding (decoded back and compared with the store)",
                    ["camera", "codec", "PSNR", "max |error|", "mean |error|"], rows)
        if report.get("store_image_loss"):  # a JPEG store: video cannot carry its frames without a second loss
            first = ", ".join(f"{cam} {db:.1f} dB" for cam, db in report["store_image_loss"].items())
            print(f"the store's frames are {report['store_image_codec']} already (PSNR at write time: {first}); "
                  "the video's loss above comes on top of it")
    print(f"{out}: LeRobot v3.0, {report['episodes']} episode(s), {report['frames']} frames; numeric columns exact")
    return 0


def import_hdf5(cfg: DictConfig, paths: list[str]) -> int:
    """ACT / ALOHA per-episode HDF5 files (a folder of episode_<n>.hdf5, or files) -> a new store."""
    from robo_rl.data.aloha_hdf5 import import_hdf5 as run_import

    out = cfg.out or (paths.pop() if len(paths) >= 2 else None)
    if not out or not paths:
        raise ConfigError("dataset import-hdf5: give the episodes and where the store goes: "
                          "import-hdf5 DIR_OR_FILES... OUT")
    with run_import(paths, out, fps=float(cfg.fps), task=cfg.task or "", robot=cfg.robot_name or "aloha",
                    overwrite=bool(cfg.overwrite), train_image_size=_copy_size(cfg)) as store:
        cams = store.schema.cameras
        print(f"{out}: {store.n_episodes} episode(s), {store.n_steps} steps at {store.schema.fps:g} fps"
              + (f", cameras {', '.join(cams)}" if cams else "") + _copies_note(store))
    return 0
