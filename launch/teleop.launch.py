"""ROS 2 launch: a human drives the arms from a teleop device through robo_rl's fixed-rate loop,
with the safety filter and watchdog of hardware/<robot>.yaml.

    ros2 launch launch/teleop.launch.py robot:=aloha teleop:=leader

Runs `robo-rl teleop` (robo_rl installed in the Python that ROS 2 uses) in its own terminal
window (`terminal`, default xterm), because the space bar (e-stop) and the keyboard device read
keys from it. teleop:=leader follows the leader arms' joint states named in the robot description.
"""

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, ExecuteProcess
from launch.substitutions import LaunchConfiguration

VERB = "teleop"
ARGS = {  # robo-rl key: (default, what it is)
    "robot": ("aloha", "hardware/<robot>.yaml: joints, limits, safety, ROS 2 topics and leader arms"),
    "teleop": ("leader", "leader (ALOHA leader arms) | keyboard | gamepad | pygame | spacemouse"),
    "transport": ("auto", "auto (rclpy when ROS 2 is sourced) | rclpy | dds (CycloneDDS)"),
}
LAUNCH_ONLY = {"terminal": ("xterm -e", "the terminal the command runs in (it reads keys)")}


def generate_launch_description() -> LaunchDescription:
    declared = [DeclareLaunchArgument(k, default_value=v, description=d) for k, (v, d) in {**ARGS, **LAUNCH_ONLY}.items()]
    # each `key=value` word is the text `key=` followed by the launch argument's value
    cmd = ["robo-rl", VERB, *([f"{k}=", LaunchConfiguration(k)] for k in ARGS)]
    return LaunchDescription([*declared, ExecuteProcess(cmd=cmd, prefix=LaunchConfiguration("terminal"), output="screen")])
