"""Run a verb as a Hydra app: overrides, `--help` with the config, `-m` multirun, and
RoboRLError turned into a one-line message and a non-zero exit instead of a traceback."""

from __future__ import annotations

import logging
import sys
from typing import Callable

from omegaconf import DictConfig

from robo_rl.assets import asset_dir
from robo_rl.errors import RoboRLError

CONFIG_DIR = asset_dir("configs")
EXIT_USER_ERROR = 2


def setup_logging(level: int = logging.INFO) -> None:
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr, force=True)
    logging.getLogger("OpenGL").setLevel(logging.WARNING)


def run_app(verb: str, config_name: str, task: Callable[[DictConfig], int | None], argv: list[str]) -> int:
    import hydra

    if not (CONFIG_DIR / f"{config_name}.yaml").is_file():
        print(f"error: config {config_name}.yaml not found in {CONFIG_DIR}; reinstall robo_rl from its checkout "
              f"(pip install . or pip install -e .)", file=sys.stderr)
        return EXIT_USER_ERROR
    result: dict[str, int] = {"code": 0}

    def _task(cfg: DictConfig) -> None:
        setup_logging()
        try:
            result["code"] = int(task(cfg) or 0)
        except RoboRLError as e:
            print(f"error: {e}", file=sys.stderr)
            raise SystemExit(EXIT_USER_ERROR) from None
        except KeyboardInterrupt:
            print("interrupted: committed data is on disk", file=sys.stderr)
            raise SystemExit(130) from None

    app = hydra.main(config_path=str(CONFIG_DIR), config_name=config_name, version_base="1.3")(_task)
    saved = sys.argv
    sys.argv = [f"robo-rl {verb}", *argv]
    try:
        app()
    finally:
        sys.argv = saved
    return result["code"]


def quote_override_value(value: str) -> str:
    """Quote a free-form string (a path, a URL) so Hydra's override grammar takes it verbatim."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def run_store_app(verb: str, task: Callable[[DictConfig], int | None], argv: list[str], config_name: str | None = None,
                  key: str = "dataset", what: str = "store") -> int:
    """Run a verb that acts on one path: `robo-rl VERB PATH k=v` reads as `robo-rl VERB dataset=PATH k=v`
    (`key=` names another config key, e.g. utd-fit's sweep folder)."""
    positional = [a for a in argv if "=" not in a and not a.startswith("-")]
    rest = [a for a in argv if a not in positional]
    if len(positional) > 1:
        print(f"error: {verb} takes one {what}, got {len(positional)}: {positional}", file=sys.stderr)
        return EXIT_USER_ERROR
    if positional:
        rest.append(f"{key}={quote_override_value(positional[0])}")
    return run_app(verb, config_name or verb, task, rest)
