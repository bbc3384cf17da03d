"""How rollcap runs on a Ray cluster: the ``ray`` config section and the ``--ray`` options.

Importing this module does not import Ray: ``require_ray`` does, and its error says how to
install the extra, so that ``--ray`` without it is a one-line error.

Config keys (``ray: {...}``; the command-line options win):

- ``enabled`` (false): run on Ray without ``--ray`` on the command line;
- ``address`` (none): the cluster to join (``ray.init``'s address; none: the cluster Ray finds
  on this host through ``RAY_ADDRESS`` or ``ray start``, else a local one);
- ``replicas`` (1): model-server replicas, spread over the nodes one by one;
- ``workers_per_node`` (1): rollout workers on each node (``eval run``);
- ``lost_retries`` (1): how many times a rollout lost with its node, worker or replica runs
  again at once (under a new attempt id) before it is left to ``--resume``;
- ``host`` (none): the address replicas and workers listen on (none: their node's address).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from types import ModuleType
from typing import Any

from rollcap.config import ConfigError

__all__ = ["INSTALL_HINT", "ClusterSettings", "require_ray"]

INSTALL_HINT = "pip install 'rollcap[ray]'"


def require_ray() -> ModuleType:
    """The ``ray`` module, or a ``ConfigError`` that says how to install it."""
    try:
        import ray
    except ImportError:
        raise ConfigError(f"--ray needs Ray, which is not installed: {INSTALL_HINT}") from None
    return ray


@dataclass(frozen=True, slots=True)
class ClusterSettings:
    """Where and how wide rollcap runs on Ray (see the module docstring for each field)."""

    enabled: bool = False
    address: str | None = None
    replicas: int = 1
    workers_per_node: int = 1
    lost_retries: int = 1
    host: str | None = None

    def __post_init__(self) -> None:
        for name in ("replicas", "workers_per_node"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"ray.{name} must be an integer of at least 1, got {value!r}")
        retries = self.lost_retries
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise ConfigError(f"ray.lost_retries must be an integer of at least 0, got {retries!r}")
        if not isinstance(self.enabled, bool):
            raise ConfigError(f"ray.enabled must be true or false, got {self.enabled!r}")
        for name in ("address", "host"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ConfigError(f"ray.{name} must be a non-empty string, got {value!r}")

    @classmethod
    def from_config(cls, config: Mapping[str, Any], **overrides: Any) -> ClusterSettings:
        """The ``ray`` section of ``config``, then ``overrides`` that are not None."""
        section = config.get("ray") or {}
        if not isinstance(section, Mapping):
            raise ConfigError(f"ray must be a mapping, got {type(section).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(section) - known)
        if unknown:
            raise ConfigError(f"unknown ray setting(s) {', '.join(unknown)}: known are {known}")
        settings = cls(**dict(section))
        given = {k: v for k, v in overrides.items() if v is not None}
        return replace(settings, **given) if given else settings
