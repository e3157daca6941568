"""Who a ROS 2 participant may discover: the lab's ROS 2 discovery settings, for the CycloneDDS transport.

ROS 2 users confine discovery with environment variables that rcl reads and each rmw turns into
its DDS configuration. DdsTransport reads the same ones, the way rcl (Jazzy) and rmw_cyclonedds
do, and hands CycloneDDS the equivalent configuration, so that a laptop set to localhost-only
never reaches (or is reached by) an arm across the room:

- `ROS_DOMAIN_ID`: the DDS domain (0 when unset).
- `ROS_LOCALHOST_ONLY=1` (Humble; deprecated in Jazzy): LOCALHOST, and ROS_STATIC_PEERS is ignored.
- `ROS_AUTOMATIC_DISCOVERY_RANGE` (Iron and later): SUBNET (the default), LOCALHOST, OFF or
  SYSTEM_DEFAULT. Like rcl, a value it does not know means LOCALHOST, with a warning.
- `ROS_STATIC_PEERS`: hosts or addresses, separated by ';', reached by unicast (not with OFF or
  SYSTEM_DEFAULT).

A robot description's `ros2.discovery:` (range, static_peers) and `ros2.domain_id` override the
environment. What each range becomes in CycloneDDS (after it, the user's own CYCLONEDDS_URI,
which wins where both set one value, as with rmw_cyclonedds):

- SUBNET: multicast discovery on the network, CycloneDDS's defaults; with static peers, also
  unicast discovery to them (participant indices 0-32 per host, as rmw_cyclonedds).
- LOCALHOST: no multicast; unicast discovery to this host's participants 0-32 and to the static
  peers. Without static peers the sockets are also bound to the loopback interface (as Humble's
  rmw_cyclonedds did), so a participant elsewhere that names this host as its peer is not
  answered either.
- OFF: this process only: no multicast, no unicast discovery, and a discovery tag no one else has.
- SYSTEM_DEFAULT: CycloneDDS's own defaults and CYCLONEDDS_URI, nothing added.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Any, Mapping

from robo_rl.errors import ConfigError

RANGES = ("SUBNET", "LOCALHOST", "OFF", "SYSTEM_DEFAULT")
DESCRIPTION = "the robot description"  # a scope's source when the description set it
MAX_PARTICIPANT_INDEX = 32  # rmw_cyclonedds: unicast discovery reaches participants 0..32 on each peer


@dataclass(frozen=True)
class DiscoveryScope:
    """A participant's discovery reach and domain, and where each came from (for start-up lines)."""

    range: str = "SUBNET"
    static_peers: tuple[str, ...] = ()
    domain_id: int = 0
    source: str = "the ROS 2 default"

    def describe(self) -> str:
        peers = f", static peers {', '.join(self.static_peers)}" if self.static_peers else ""
        return f"ROS domain {self.domain_id}, discovery {self.range}{peers} ({self.source})"

    def cyclone_config(self, pid: int | None = None) -> str:
        """The CycloneDDS configuration (inline XML) that gives this reach; '' where CycloneDDS's
        defaults already do (SUBNET without peers, SYSTEM_DEFAULT)."""
        peers = "".join(f'<Peer address="{_xml_attr(p)}"/>' for p in self.static_peers)
        index = f"<ParticipantIndex>auto</ParticipantIndex><MaxAutoParticipantIndex>{MAX_PARTICIPANT_INDEX}" \
                "</MaxAutoParticipantIndex>"
        if self.range == "SUBNET":
            return f"<Discovery>{index}<Peers>{peers}</Peers></Discovery>" if peers else ""
        if self.range == "LOCALHOST":
            loopback = "" if peers else '<Interfaces><NetworkInterface address="127.0.0.1"/></Interfaces>'
            return (f"<General>{loopback}<AllowMulticast>false</AllowMulticast></General>"
                    f'<Discovery>{index}<Peers><Peer address="localhost"/>{peers}</Peers></Discovery>')
        if self.range == "OFF":
            tag = f"ros_discovery_off_{os.getpid() if pid is None else pid}"
            return ("<General><AllowMulticast>false</AllowMulticast></General>"
                    f"<Discovery><ParticipantIndex>none</ParticipantIndex><Tag>{tag}</Tag></Discovery>")
        return ""


def rcl_environment(scope: DiscoveryScope, distro: str | None = None) -> dict[str, str | None]:
    """The ROS 2 variables that give rcl `scope` (for the rclpy transport, where rcl reads them at
    init): name -> value, None to unset. `distro` (ROS_DISTRO): Humble's rcl knows only
    ROS_LOCALHOST_ONLY, so a range it cannot express there is an error rather than a wider reach."""
    env: dict[str, str | None] = {"ROS_AUTOMATIC_DISCOVERY_RANGE": scope.range,
                                  "ROS_STATIC_PEERS": ";".join(scope.static_peers) or None,
                                  # Jazzy still honours ROS_LOCALHOST_ONLY=1 over the range: keep it for
                                  # LOCALHOST alone, and clear it for every other range
                                  "ROS_LOCALHOST_ONLY": "1" if scope.range == "LOCALHOST" and not scope.static_peers
                                  else None}
    if (distro or "").lower() == "humble" and (scope.range == "OFF" or scope.static_peers):
        raise ConfigError(f"discovery {scope.range}{' with static peers' if scope.static_peers else ''} "
                          f"({scope.source}): ROS 2 Humble's rcl knows only ROS_LOCALHOST_ONLY. Use "
                          "transport=dds, or set the reach in your CYCLONEDDS_URI and drop it from the description")
    return env


def _xml_attr(value: str) -> str:
    return value.replace("&", "&amp;").replace('"', "&quot;").replace("<", "&lt;").replace(">", "&gt;")


_WARNED: set[str] = set()


def _warn(message: str) -> None:
    if message not in _WARNED:  # the scope is read more than once per command (the description, the transport)
        _WARNED.add(message)
        print(f"warning: {message}", file=sys.stderr)


def domain_from_env(env: Mapping[str, str] | None = None) -> tuple[int, str]:
    """(domain id, where it came from): ROS_DOMAIN_ID, or 0."""
    env = os.environ if env is None else env
    value = env.get("ROS_DOMAIN_ID", "").strip()
    if not value:
        return 0, "the default"
    if not value.isdigit() or int(value) > 232:
        raise ConfigError(f"ROS_DOMAIN_ID={value!r}: give a domain id from 0 to 232 (or unset it for 0)")
    return int(value), "ROS_DOMAIN_ID"


def scope_from_env(env: Mapping[str, str] | None = None, domain_id: int | None = None) -> DiscoveryScope:
    """The discovery scope ROS 2's environment variables ask for, read as rcl (Jazzy) reads them."""
    env = os.environ if env is None else env
    domain = domain_from_env(env)[0] if domain_id is None else int(domain_id)
    if env.get("ROS_LOCALHOST_ONLY", "").startswith("1"):  # rcl: overrides the range and drops the peers
        return DiscoveryScope("LOCALHOST", (), domain, "ROS_LOCALHOST_ONLY=1")
    value = env.get("ROS_AUTOMATIC_DISCOVERY_RANGE", "")
    source = f"ROS_AUTOMATIC_DISCOVERY_RANGE={value}" if value else "the ROS 2 default"
    if value and value not in RANGES:
        _warn(f"ROS_AUTOMATIC_DISCOVERY_RANGE={value!r} is not one of {', '.join(RANGES)}; "
              "assuming LOCALHOST, as ROS 2 does")
        value, source = "LOCALHOST", f"ROS_AUTOMATIC_DISCOVERY_RANGE={value!r}, not a range: LOCALHOST as ROS 2"
    rng = value or "SUBNET"
    peers = tuple(p for p in env.get("ROS_STATIC_PEERS", "").split(";") if p)
    if peers and rng in ("OFF", "SYSTEM_DEFAULT"):
        _warn(f"ROS_STATIC_PEERS is ignored with discovery {rng}, as in ROS 2")
        peers = ()
    if peers:
        source += " + ROS_STATIC_PEERS"
    return DiscoveryScope(rng, peers, domain, source)


def resolve_scope(description: Mapping[str, Any] | None, where: str, domain_id: int | None = None,
                  env: Mapping[str, str] | None = None) -> DiscoveryScope:
    """The scope in force: a robot description's `ros2.discovery` (range, static_peers) over the
    environment's; `domain_id` (the description's or the command line's) over ROS_DOMAIN_ID."""
    base = scope_from_env(env, domain_id)
    if not description:
        return base
    if not isinstance(description, Mapping):
        raise ConfigError(f"{where}.discovery is a mapping, e.g. {{range: LOCALHOST, static_peers: [10.0.0.5]}}")
    extra = sorted(set(description) - {"range", "static_peers"})
    if extra:
        raise ConfigError(f"{where}.discovery: unknown key(s) {extra}; known: ['range', 'static_peers']")
    rng = str(description.get("range", "SUBNET")).upper()
    if rng not in RANGES:
        raise ConfigError(f"{where}.discovery.range={description.get('range')!r}; choose one of {', '.join(RANGES)}")
    peers = description.get("static_peers", [])
    if isinstance(peers, str):
        peers = [p for p in peers.split(";") if p]
    if not isinstance(peers, (list, tuple)) or not all(isinstance(p, str) and p for p in peers):
        raise ConfigError(f"{where}.discovery.static_peers={peers!r}; give a list of hosts or addresses")
    if peers and rng in ("OFF", "SYSTEM_DEFAULT"):
        raise ConfigError(f"{where}.discovery: static_peers mean nothing with range {rng}; drop them or use "
                          "SUBNET or LOCALHOST")
    return DiscoveryScope(rng, tuple(peers), base.domain_id, DESCRIPTION)
