"""robo_rl: record, train, fine-tune with RaC, and deploy action-chunk policies on bimanual arms."""

from robo_rl.errors import RoboRLError

__version__ = "0.1.0"
__all__ = ["RoboRLError", "__version__"]
