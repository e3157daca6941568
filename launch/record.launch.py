"""ROS 2 launch: record teleop demos (or a policy's rollouts with a human taking over) from the
arms and their cameras into a robo_rl episode store.

    ros2 launch launch/record.launch.py out:=/data/demos/pack robot:=aloha teleop:=leader cameras:="[top,left_wrist]"

Runs `robo-rl record` in its own terminal window (`terminal`, default xterm): n starts an episode,
y ends it as a success, f as a failure, x discards it, space is the e-stop, Ctrl-C quits. Every
ended episode is committed even if the session is killed.
"""

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, ExecuteProcess
from launch.substitutions import LaunchConfiguration

VERB = "record"
ARGS = {  # robo-rl key: (default, what it is)
    "out": ("data/demos/aloha", "the episode store (created, or appended to)"),
    "robot": ("aloha", "hardware/<robot>.yaml: joints, limits, safety, ROS 2 topics, cameras and leader arms"),
    "teleop": ("leader", "leader (ALOHA leader arms) | keyboard | gamepad | pygame | spacemouse"),
    "task": ("aloha_task", "the task name written with each episode"),
    "cameras": ("[top]", "cameras to record, as named in the robot description"),
    "episode_s": ("60", "an episode ends after this many seconds"),
    "transport": ("auto", "auto (rclpy when ROS 2 is sourced) | rclpy | dds (CycloneDDS)"),
}
LAUNCH_ONLY = {"terminal": ("xterm -e", "the terminal the command runs in (it reads the episode keys)")}


def generate_launch_description() -> LaunchDescription:
    declared = [DeclareLaunchArgument(k, default_value=v, description=d) for k, (v, d) in {**ARGS, **LAUNCH_ONLY}.items()]
    cmd = ["robo-rl", VERB, *([f"{k}=", LaunchConfiguration(k)] for k in ARGS)]
    return LaunchDescription([*declared, ExecuteProcess(cmd=cmd, prefix=LaunchConfiguration("terminal"), output="screen")])
