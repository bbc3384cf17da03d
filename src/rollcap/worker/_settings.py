"""The capture worker's settings, validated once when they are made."""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

__all__ = ["WorkerSettings", "prepare_staging_dir"]

_U64_MAX = 2**64 - 1


@dataclass(frozen=True, slots=True)
class WorkerSettings:
    """One capture worker in front of one vLLM-compatible chat endpoint.

    ``upstream_url`` is the endpoint's base URL, with or without a trailing ``/v1``.
    ``api_key`` goes upstream as a Bearer token and nowhere else (it is left out of ``repr``).
    ``weight_version`` is stamped on every staged call. ``read_timeout_s`` is the longest
    silence between two upstream bytes: a non-streamed generation sends nothing until it ends.
    ``prefix_cache_ids`` bounds the ids kept in memory for continuations' prefixes
    (``_prefixes``).
    """

    upstream_url: str
    staging_dir: Path
    api_key: str | None = field(default=None, repr=False)
    weight_version: int = 0
    connect_timeout_s: float = 30.0
    read_timeout_s: float = 600.0
    # The full ids of each rollout's last staged call, kept for its continuation's prefix, at
    # most this many ids in all (8 bytes each; 0: always read the chain back from disk).
    prefix_cache_ids: int = 16_000_000

    def __post_init__(self) -> None:
        url = self.upstream_url
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ValueError(f"the upstream URL {url!r} must start with http:// or https://")
        parts = urlsplit(url)
        if not parts.hostname:
            raise ValueError(f"the upstream URL {url!r} has no host")
        if parts.username is not None or parts.password is not None:
            # A credential in the URL would show up wherever the URL is printed or logged.
            raise ValueError(
                "the upstream URL must not carry credentials; pass the key through an "
                "environment variable (--api-key-env)"
            )
        if parts.query or parts.fragment:
            raise ValueError(f"the upstream URL {url!r} must have no query or fragment")
        staging_dir = Path(self.staging_dir)
        if not staging_dir.is_absolute():
            raise ValueError(
                f"the staging directory must be an absolute path, got {str(staging_dir)!r}"
            )
        object.__setattr__(self, "staging_dir", staging_dir)
        version = self.weight_version
        if (
            isinstance(version, bool)
            or not isinstance(version, int)
            or not 0 <= version <= _U64_MAX
        ):
            raise ValueError(f"the weight version must be in 0..2**64-1, not {version!r}")
        for name in ("connect_timeout_s", "read_timeout_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise ValueError(f"{name} must be a number > 0, not {value!r}")
        cache = self.prefix_cache_ids
        if isinstance(cache, bool) or not isinstance(cache, int) or cache < 0:
            raise ValueError(f"prefix_cache_ids must be an integer >= 0, not {cache!r}")
        if self.api_key is not None and not isinstance(self.api_key, str):
            raise ValueError("the upstream API key must be a string")


def prepare_staging_dir(path: Path) -> None:
    """Create the staging directory if needed; ``ValueError`` when calls could not be staged
    there, so a worker that would fail every capture does not start."""
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    except FileExistsError:
        raise ValueError(f"the staging directory {str(path)!r} is not a directory") from None
    except OSError as exc:
        raise ValueError(
            f"the staging directory {str(path)!r} cannot be created: {exc.strerror or exc}"
        ) from None
    if not path.is_dir():
        raise ValueError(f"the staging directory {str(path)!r} is not a directory")
    # A file made and removed, not os.access: the permission bits do not bind root, and say
    # nothing of a read-only mount or a server that squashes root.
    try:
        fd, probe = tempfile.mkstemp(prefix=".rollcap-probe-", dir=path)
    except OSError as exc:
        raise ValueError(
            f"the staging directory {str(path)!r} is not writable: {exc.strerror or exc}"
        ) from None
    os.close(fd)
    os.unlink(probe)
