import os
import signal
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).parent
sys.path.insert(0, str(TESTS))
os.environ.setdefault("MUJOCO_GL", "egl")

# A shell without job control starts background commands (`make test &`, some CI runners) with
# SIGINT ignored, and every process they start inherits that: the tests that stop a CLI with
# Ctrl-C (SIGINT) would wait forever. A handler here is reset to the default in each child at exec.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

from episodes import make_episode, small_schema  # noqa: E402

from robo_rl.data.store import EpisodeStore  # noqa: E402


@pytest.fixture
def schema():
    return small_schema()


@pytest.fixture
def filled_store(tmp_path, schema):
    """A store with 6 generated episodes, open for appending."""
    store = EpisodeStore.create(tmp_path / "store", schema)
    for e in range(6):
        data, ts, seg, meta = make_episode(e, schema)
        store.add_episode(data, ts, seg, meta)
    yield store
    store.close()


def robo_rl_cli(*args: str, timeout: float = 300):
    """`robo-rl ARGS` in a subprocess from the checkout, output captured."""
    import subprocess

    env = {**os.environ, "MUJOCO_GL": "egl", "TQDM_DISABLE": "1"}
    return subprocess.run([sys.executable, "-m", "robo_rl.cli.main", *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=TESTS.parent, stdin=subprocess.DEVNULL)


class OnNthCommand:
    """A robot as the control loop sees it, calling `action()` once, as the loop sends its `n`th
    command: a test's event follows the loop's progress, not a wall clock that the loop's start
    (a garbage collection on a big heap) can outrun."""

    def __init__(self, robot, n: int, action):
        self.robot, self.n, self.action, self.commands = robot, n, action, 0

    def __getattr__(self, name: str):
        return getattr(self.robot, name)

    def act(self, a):
        self.commands += 1
        if self.commands == self.n:
            self.action()
        return self.robot.act(a)


def robo_rl_in_process(capsys, *args: str) -> tuple[int, str]:
    """`robo-rl ARGS` in this process (no interpreter start-up, 2-4 s of imports): (exit code,
    stderr). For refusals of bad input; `robo_rl_cli` runs a command as a user does."""
    from robo_rl.cli.main import main

    capsys.readouterr()
    try:
        code = main(list(args))
    except SystemExit as e:
        code = e.code
    return code, capsys.readouterr().err


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory):
    """Tiny flow policies trained for a few steps on TransferCube demos: `state` on qpos +
    object state, `qpos` on qpos alone (what real arms can give)."""
    tmp = tmp_path_factory.mktemp("tiny_policies")
    demos = tmp / "demos"
    r = robo_rl_cli("collect", "task=transfer_cube", "episodes=2", "cameras=[]", f"out={demos}")
    assert r.returncode == 0, r.stderr
    out = {}
    for name, keys in (("state", "[obs/qpos,obs/env_state]"), ("qpos", "[obs/qpos]")):
        run = tmp / name
        r = robo_rl_cli("train", "policy=flow", "task=transfer_cube", f"dataset={demos}", f"run_dir={run}",
                        "learner.steps=5", "learner.batch_size=8", "eval.episodes=0", "policy.dit_dim=32",
                        "policy.dit_depth=2", f"obs_keys={keys}")
        assert r.returncode == 0, r.stderr
        out[name] = run / "checkpoints" / "last.pt"
    # `camera`: top camera 48x64 + qpos, the conv encoder, one frame (what a real arm can run)
    cam_demos = tmp / "cam_demos"
    r = robo_rl_cli("collect", "task=transfer_cube", "episodes=1", "cameras=[top]", "image_size=[48,64]", f"out={cam_demos}")
    assert r.returncode == 0, r.stderr
    r = robo_rl_cli("train", "policy=flow", "task=transfer_cube", f"dataset={cam_demos}", f"run_dir={tmp / 'camera'}",
                    "learner.steps=5", "learner.batch_size=8", "eval.episodes=0", "policy.dit_dim=32", "policy.dit_depth=2",
                    "policy.image_encoder=conv", "policy.n_obs=1", "obs_keys=[obs/qpos,obs/images/top]", "recipe=none")
    assert r.returncode == 0, r.stderr
    out["camera"] = tmp / "camera" / "checkpoints" / "last.pt"
    return out
