"""robo-rl rac: RaC rounds (collect interventions -> fine-tune -> evaluate) against HG-DAgger and
more expert demos at equal operator samples, with a results table, results.json and PNG plots."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from robo_rl.cli.app import run_app
from robo_rl.cli.tables import print_table
from robo_rl.errors import ConfigError
from robo_rl.hardware.teleop import TELEOP_KINDS
from robo_rl.rac.experiment import METHODS, label  # rac, hg_dagger, demos and the control, no_new_data
from robo_rl.rac.intervention import LABELS as PHASE_LABELS  # a controller phase -> its segment label

OPERATORS = ("sim", *TELEOP_KINDS)  # the simulated operator, or a human on a teleop device
OWN_COMPOSITION = {"rac": "rac", "hg_dagger": "hg_dagger", "demos": "all", "no_new_data": "all"}
LABELS = {**{m: label(m) for m in METHODS}, "base": "pre-trained"}


def main(argv: list[str]) -> int:
    return run_app("rac", "rac", run, argv)


def evaluate(policy: Any, task: str, chunking: dict, cfg: DictConfig, out: Path | None, checkpoint: Path,
             videos: int = 0, predict: Any = None) -> dict[str, Any]:
    """One policy's row. processes=2: its episodes in two halves, the second in a spawned process
    that loads `checkpoint` (the same weights), one torch thread each: the twin steps on one core,
    so two cores take about half the time. processes=1: all in this process, on every thread."""
    from robo_rl.sim.evaluate import evaluate_with_recoveries

    beside = int(cfg.processes) > 1
    return evaluate_with_recoveries(policy, task, chunking, int(cfg.eval.episodes), int(cfg.eval.n_envs), int(cfg.eval.seed),
                                    int(cfg.eval.max_recoveries), out, videos, predict, shards=2 if beside else 1,
                                    beside=(checkpoint, next(policy.parameters()).device.type) if beside else None)


def run(cfg: DictConfig) -> int:
    from robo_rl.policies import read_checkpoint
    from robo_rl.sim.tasks import TASKS

    if not cfg.checkpoint:
        raise ConfigError("rac: pass checkpoint=PATH (a policy pre-trained with robo-rl train)")
    methods = list(cfg.methods)
    unknown = [m for m in methods if m not in METHODS]
    if unknown or not methods:
        raise ConfigError(f"rac: methods={methods}; choose from {list(METHODS)}")
    if cfg.operator not in OPERATORS:
        raise ConfigError(f"rac: operator={cfg.operator!r}; choose one of {', '.join(OPERATORS)}")
    human = cfg.operator != "sim"
    if human and "demos" in methods:
        raise ConfigError(f"rac: with operator={cfg.operator} the 'more expert demos' baseline would need a human's demos; "
                          "pass methods=[rac] or methods=[rac,hg_dagger]")
    if cfg.view and not human:  # view=true: the Rerun viewer (robo_rl/cli/view.py)
        raise ConfigError("rac: view=true shows a human operator's rollouts (operator=keyboard|gamepad|...); the "
                          "simulated operator's rollouts run n_envs at a time, faster than real time: look at "
                          "them afterwards with robo-rl view OUT/rac/data/round1 episode=N")
    if int(cfg.processes) not in (1, 2):
        raise ConfigError(f"rac: processes={cfg.processes}; 2 evaluates in two halves side by side, 1 in this process")
    if int(cfg.rounds) < 1 or int(cfg.episodes_per_round) < 1:
        raise ConfigError(f"rac: rounds and episodes_per_round must be >= 1 (got {cfg.rounds}, {cfg.episodes_per_round})")
    ckpt = read_checkpoint(cfg.checkpoint)
    task = cfg.task or ckpt.get("task")
    if task not in TASKS:
        raise ConfigError(f"rac: task={task!r} unknown; tasks are {sorted(TASKS)}")
    demos = cfg.demos or ckpt.get("dataset")
    n_demos = cfg.n_demos if cfg.n_demos is not None else ckpt.get("n_episodes")
    if not demos or not Path(demos).exists():
        raise ConfigError(f"rac: the pre-training demos {demos!r} are not there; pass demos=PATH")
    out = Path(cfg.out) if cfg.out else Path("data/rac") / f"{task}-{time.strftime('%Y%m%d-%H%M%S')}"
    if (out / "results.json").exists() and not (out / "stages.json").exists():  # a run from before `resume`
        raise ConfigError(f"rac: {out} already holds results; pass another out=")
    human_session = HumanSession(cfg) if human else None  # before any output: a missing device stops here
    try:
        from robo_rl.rac.experiment import Stages

        stages = Stages(out, cfg, bool(cfg.resume), verb="rac")  # the settings are checked: the run is written down from here
        return run_rounds(cfg, ckpt, task, demos, n_demos, out, methods, human_session, stages)
    finally:
        if human_session is not None:
            human_session.close()  # the terminal gets its echo back, on errors and Ctrl-C too


def run_rounds(cfg: DictConfig, ckpt: dict[str, Any], task: str, demos: str, n_demos: int | None, out: Path,
               methods: list[str], human_session: "HumanSession | None", stages: Any) -> int:
    from robo_rl.learn import LearnerConfig, last_checkpoint
    from robo_rl.learn.learner import resolve_device
    from robo_rl.learn.recipes import with_camera_learner
    from robo_rl.policies import load_policy
    from robo_rl.policies.inference import predictor
    from robo_rl.rac.experiment import Rounds, run_rounds
    from robo_rl.rac.mixing import CompositionConfig
    from robo_rl.runtime.chunking import ChunkingConfig
    from robo_rl.sim.interventions import collect_expert_demos, collect_interventions
    from robo_rl.sim.operator import OperatorConfig
    from robo_rl.sim.room import randomizer_option

    human = human_session is not None
    chunking = dict(ckpt.get("chunking") or {})
    chunk_cfg = ChunkingConfig(**chunking)
    obs_keys = list(ckpt["obs_keys"])
    base = load_policy(ckpt)
    randomizer_option(cfg.randomize_room, "rac",
                      None if base.shapes.images else f"{cfg.checkpoint} holds a policy without cameras")
    finetune_opts = OmegaConf.to_container(cfg.finetune, resolve=True)  # a camera policy: the recipe's bf16, compile
    learner_cfg = LearnerConfig.from_dict(with_camera_learner(finetune_opts, bool(base.shapes.images),
                                                              resolve_device(str(finetune_opts.get("device", "auto")))))
    op_cfg = OperatorConfig(**OmegaConf.to_container(cfg.operator_config, resolve=True))
    comp_opts = OmegaConf.to_container(cfg.composition, resolve=True)

    results: dict[str, Any] = {"task": task, "checkpoint": str(cfg.checkpoint), "demos": str(demos), "n_demos": n_demos,
                               "rows": [], "resumed": stages.resumed, "timings_s": stages.timings}

    def save() -> None:
        tmp = out / "results.json.tmp"
        tmp.write_text(json.dumps(results, indent=1))
        tmp.replace(out / "results.json")

    print(f"rac {task}: evaluating the pre-trained policy on {cfg.eval.episodes} episodes")
    # One predictor per policy, shared by its evaluation and the next round's rollouts: each
    # holds a traced graph whose memory TorchScript never gives back (FrozenPredictor).
    base_predict = predictor(base)
    results["base"] = stages.run("evaluate pre-trained",
                                 lambda: evaluate(base, task, chunking, cfg, out / "eval-base", Path(cfg.checkpoint),
                                                  predict=base_predict))
    save()
    budget: dict[int, int] = {}  # round -> RaC's cumulative operator samples
    cameras = sorted(k.rsplit("/", 1)[-1] for k in base.shapes.images)  # a camera policy's rollouts record them
    image_size = next(iter(base.shapes.images.values()), None)
    for m_index, method in enumerate(methods):

        def collect(method: str, predict: Any, store: Path, r: int, need: int | None) -> dict[str, Any]:
            seed = 200_000 + 10_000 * int(cfg.seed) + 1_000 * m_index + 100 * r
            if method == "demos":
                if need is None:  # no RaC run to match: as many demo steps as RaC episodes would take
                    need = int(cfg.episodes_per_round) * 200
                return collect_expert_demos(task, store, seed=300_000 + seed, max_samples=need, cameras=cameras,
                                            image_size=image_size, randomize_room=bool(cfg.randomize_room)).to_dict()
            # a baseline runs until it matches RaC's operator samples; a human gets at most 3x the episodes
            episodes = int(cfg.episodes_per_round) * (1 if need is None else 3 if human else 50)
            human_opts = human_session.collect_options(method, r) if human_session else {}
            st = collect_interventions(predict, task, obs_keys, base.config.n_obs, base.config.horizon, chunk_cfg, store,
                                       episodes, seed, mode=method, n_envs=1 if human else int(cfg.n_envs),
                                       operator=op_cfg, max_operator_samples=need, image_size=image_size,
                                       randomize_room=bool(cfg.randomize_room), **human_opts)
            if human_session:
                human_session.close_view()
            return st.to_dict()

        def evaluate_round(policy: Any, predict: Any, eval_out: Path, r: int) -> dict[str, Any]:
            return evaluate(policy, task, chunking, cfg, eval_out, last_checkpoint(plan.run_dir(r)),
                            videos=2 if r == int(cfg.rounds) else 0, predict=predict)

        def extra(r: int, method: str = method) -> dict[str, Any]:
            return {"rac": {"method": method, "round": r}}

        # each round's data in its own store, so that an interrupted round's is set aside (run_rounds)
        plan = Rounds(method, int(cfg.rounds), ckpt, [(demos, n_demos)], lambda r, method=method: out / method / "data" / f"round{r}",
                      lambda r, method=method: out / method / f"round{r}", learner_cfg,
                      CompositionConfig(**{**comp_opts, "mode": comp_opts.get("mode") or OWN_COMPOSITION[method]}),
                      bool(cfg.from_scratch), resolve_device(learner_cfg.device), extra,
                      stage_names=("{label} rollouts, round {r}", "{label} {how}, round {r}", "{label} evaluation, round {r}"))

        def record_row(row: dict[str, Any]) -> None:
            results["rows"].append(row)
            save()
            print(f"{LABELS[row['method']]} round {row['round']}: {row['operator_samples']} operator samples, "
                  f"success {row['success_rate']:.0%} [{row['ci95_low']:.0%}, {row['ci95_high']:.0%}]")

        run_rounds(plan, base, base_predict, collect, evaluate_round, budget=budget, stages=stages,
                   resume=bool(cfg.resume), predictor=predictor, on_row=record_row)
    print_results(results)
    write_plots(results, out)
    print(f"results: {out / 'results.json'}; plots: {out}/*.png")
    return 0


class HumanSession:
    """A human on a keyboard (this terminal) or a gamepad steering the intervention rollouts in
    the twin: one env, real time, the MuJoCo viewer when there is a display."""

    def __init__(self, cfg: DictConfig):
        from robo_rl.hardware.teleop import make_teleop

        from robo_rl.cli.session import check_live_view, open_live_view

        check_live_view(cfg)  # view=true: the Rerun viewer, before the device opens
        self.view = None
        # first: if the live view cannot open, no device was opened; its joint names come with the twin (on_tick)
        self.live = open_live_view(cfg, "rac")
        self._named = False
        try:
            self.device = make_teleop(cfg.operator, **OmegaConf.to_container(cfg.teleop, resolve=True))
        except BaseException:
            if self.live is not None:
                self.live.close()
            raise

    def collect_options(self, method: str, round_: int) -> dict[str, Any]:
        from robo_rl.hardware.teleop import KeyboardTeleop
        from robo_rl.sim.teleop import HumanView, TeleopOperator

        keyboard = self.device if isinstance(self.device, KeyboardTeleop) else None
        print(f"\n{LABELS[method]} round {round_}: the policy drives; take over when it is about to fail.\n"
              + getattr(self.device, "keys_help", ""))  # each device's keys (robo_rl/hardware/teleop)

        def make_operator(env):
            self.view = HumanView(env, keyboard)
            return TeleopOperator(env, self.device, recover=method == "rac")

        if self.live is not None:
            self.live.mark(f"{LABELS[method]} round {round_}")
        return {"make_operator": make_operator, "realtime": True, "on_tick": self.on_tick, "progress": False}

    def on_tick(self, env: Any, ctl: Any) -> None:
        self.view(env, ctl)
        if self.live is not None:  # view=true; never blocks (a full queue drops the step)
            if not self._named:  # the twin's joints name the qpos / qvel lines (set before its first step is queued)
                self.live.logger.joint_names = list(env.robot.spec.joint_names)
                self._named = True
            # No `action` here: collect_interventions does not hand on_tick the step's command, and
            # neither the env (BimanualEnv returns it only in step()'s info["executed_action"]) nor
            # SimRobot keeps the last executed action (data.ctrl holds actuator units, not commands).
            values = {"obs/qpos": env.robot.joint_positions(), "obs/qvel": env.robot.joint_velocities(),
                      "task/stage": env.task.stage(env.robot)}
            self.live.step(values, PHASE_LABELS[ctl.phase])

    def close_view(self) -> None:
        if self.view is not None:
            self.view.close()
            self.view = None

    def close(self) -> None:
        from robo_rl.cli.session import close_session
        from robo_rl.cli.session import print_live_summary

        view, self.view = self.view, None
        try:
            close_session(view, self.device, self.live)  # each closes even if one before failed; the live view last
        finally:
            print_live_summary(self.live)


def print_results(results: dict[str, Any]) -> None:
    b = results["base"]
    rows = [["pre-trained", "-", "0", "0", "-", f"{b['success_rate']:.0%} [{b['ci95_low']:.0%}, {b['ci95_high']:.0%}]",
             f"{b['mean_recoveries']:.2f}"]]
    for r in results["rows"]:
        rows.append([LABELS[r["method"]], str(r["round"]), f"{r['operator_samples']:,}", f"{r['operator_time_s'] / 60:.1f}",
                     f"{r['episodes']} demos" if r["method"] == "demos" else "-" if r["method"] == "no_new_data"
                     else str(r["interventions"]),
                     f"{r['success_rate']:.0%} [{r['ci95_low']:.0%}, {r['ci95_high']:.0%}]", f"{r['mean_recoveries']:.2f}"])
    print_table(f"RaC on {results['task']}: success over the eval episodes (95% Wilson)",
                ["method", "round", "operator samples", "operator min", "interventions", "success", "recoveries/ep"], rows)


def write_plots(results: dict[str, Any], out: Path) -> list[Path]:
    """success vs operator samples, vs operator time, and vs recovery manoeuvres (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    base = results["base"]
    methods = list(dict.fromkeys(r["method"] for r in results["rows"]))
    paths = []
    for key, xlabel, scale, name in [("operator_samples", "cumulative operator samples (steps)", 1.0, "success_vs_samples"),
                                     ("operator_time_s", "cumulative operator time (min)", 1 / 60, "success_vs_time")]:
        fig, ax = plt.subplots(figsize=(6, 4))
        for m in methods:
            rows = [r for r in results["rows"] if r["method"] == m]
            if m == "no_new_data":  # no operator effort: a reference level across the plot
                ax.axhline(rows[-1]["success_rate"], color="grey", linestyle="--", label=LABELS[m])
                continue
            x = [0.0] + [r[key] * scale for r in rows]
            y = [base["success_rate"]] + [r["success_rate"] for r in rows]
            lo = [base["ci95_low"]] + [r["ci95_low"] for r in rows]
            hi = [base["ci95_high"]] + [r["ci95_high"] for r in rows]
            ax.plot(x, y, marker="o", label=LABELS[m])
            ax.fill_between(x, lo, hi, alpha=0.15)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("success rate")
        ax.set_ylim(0, 1)
        ax.set_title(f"{results['task']}: success vs operator effort")
        ax.legend()
        fig.tight_layout()
        paths.append(out / f"{name}.png")
        fig.savefig(paths[-1], dpi=120)
        plt.close(fig)
    fig, ax = plt.subplots(figsize=(6, 4))
    finals = [("base", base)] + [(m, [r for r in results["rows"] if r["method"] == m][-1]) for m in methods]
    for m, r in finals:
        ax.plot(range(len(r["success_within"])), r["success_within"], marker="o", label=LABELS[m])
    ax.set_xlabel("recovery manoeuvres the policy may perform")
    ax.set_ylabel("success rate")
    ax.set_ylim(0, 1)
    ax.set_title(f"{results['task']}: test-time scaling (final policies)")
    ax.legend()
    fig.tight_layout()
    paths.append(out / "test_time_scaling.png")
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)
    return paths
