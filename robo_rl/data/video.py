"""Moved to robo_rl/data/codecs.py (Mp4Writer, probe). Kept only so robo_rl/sim/rollout.py's
`from robo_rl.data.video import Mp4Writer` keeps working until it imports from codecs; then delete
this file."""

from robo_rl.data.codecs import Mp4Writer, probe

__all__ = ["Mp4Writer", "probe"]
