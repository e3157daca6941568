"""ROS 2 launch: a trained policy on the arms, through robo_rl's fixed-rate loop with the safety
filter and watchdog of hardware/<robot>.yaml.

    ros2 launch launch/deploy.launch.py checkpoint:=/path/to/last.pt robot:=aloha duration:=60

Runs `robo-rl deploy` (robo_rl installed in the Python that ROS 2 uses). Publish True on
estop_topic (std_msgs/Bool) to stop it; it prints its timing table when it ends.
"""

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, ExecuteProcess
from launch.substitutions import LaunchConfiguration

VERB = "deploy"
ARGS = {  # robo-rl key: (default, what it is)
    "checkpoint": ("", "the policy: checkpoints/last.pt of a robo-rl train run (trained on obs/qpos)"),
    "robot": ("aloha", "hardware/<robot>.yaml: joints, limits, safety and ROS 2 topics"),
    "duration": ("30", "seconds to run"),
    "transport": ("auto", "auto (rclpy when ROS 2 is sourced) | rclpy | dds (CycloneDDS)"),
    "estop_topic": ("/robo_rl/estop", "std_msgs/Bool: True stops the robot at the next tick"),
}


def generate_launch_description() -> LaunchDescription:
    declared = [DeclareLaunchArgument(k, default_value=v, description=d) for k, (v, d) in ARGS.items()]
    # each `key=value` word is the text `key=` followed by the launch argument's value
    cmd = ["robo-rl", VERB, *([f"{k}=", LaunchConfiguration(k)] for k in ARGS)]
    return LaunchDescription([*declared, ExecuteProcess(cmd=cmd, output="screen")])
