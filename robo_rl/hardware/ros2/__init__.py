"""ROS 2 for robo_rl: one message layer (messages.py, ROS field names and DDS type names) and its
transports. The DDS transport (CycloneDDS, on PyPI) talks to ROS 2 nodes without a ROS install."""
