"""ROS 2 launch: the MuJoCo twin served as a robot on the topics of hardware/<robot>.yaml.

    ros2 launch launch/sim_bridge.launch.py robot:=aloha scene:=aloha.xml cameras:=[top]

Runs `robo-rl sim-bridge` (robo_rl installed in the Python that ROS 2 uses). The environment's
ROS_DOMAIN_ID applies unless domain_id is given.
"""

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, ExecuteProcess
from launch.substitutions import LaunchConfiguration

VERB = "sim-bridge"
ARGS = {  # robo-rl key: (default, what it is)
    "robot": ("aloha", "hardware/<robot>.yaml: joints, limits, safety and ROS 2 topics"),
    "scene": ("aloha.xml", "sim/<scene>: the twin, or a task scene such as pack_cube.xml"),
    "transport": ("auto", "auto (rclpy when ROS 2 is sourced) | rclpy | dds (CycloneDDS)"),
    "cameras": ("[]", "cameras to render and publish on their ros2.cameras topics, e.g. [top,left_wrist]"),
    "camera_hz": ("15", "frames per second per camera"),
    "image_size": ("[240,320]", "[height, width] of the rendered frames"),
    "image_type": ("null", "null (each camera's ros2.cameras type) | image | compressed"),
}


def generate_launch_description() -> LaunchDescription:
    declared = [DeclareLaunchArgument(k, default_value=v, description=d) for k, (v, d) in ARGS.items()]
    # each `key=value` word is the text `key=` followed by the launch argument's value
    cmd = ["robo-rl", VERB, *([f"{k}=", LaunchConfiguration(k)] for k in ARGS)]
    return LaunchDescription([*declared, ExecuteProcess(cmd=cmd, output="screen")])
