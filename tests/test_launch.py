"""The ROS 2 launch files pass only verbs and keys that robo_rl has. (Running them needs ROS 2's
`launch` package, which only a ROS 2 install provides.)"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import yaml

from robo_rl.cli.main import VERBS

ROOT = Path(__file__).parents[1]


def _constant(tree: ast.Module, name: str):
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError(f"no {name} in the launch file")


@pytest.mark.parametrize("path", sorted((ROOT / "launch").glob("*.launch.py")), ids=lambda p: p.name)
def test_launch_file_verbs_and_keys_exist(path):
    tree = ast.parse(path.read_text())
    verb, args = _constant(tree, "VERB"), _constant(tree, "ARGS")
    assert verb in VERBS, f"{path.name}: robo-rl has no verb {verb!r}"
    module = VERBS[verb][0].rsplit(".", 1)[-1]
    config = yaml.safe_load((ROOT / "configs" / f"{module}.yaml").read_text())
    unknown = sorted(set(args) - set(config))
    assert not unknown, f"{path.name}: {verb} has no key(s) {unknown}"
    assert "generate_launch_description" in {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
