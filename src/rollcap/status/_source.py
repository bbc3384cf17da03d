"""Where a person's tools read a run's live status from: a head server (``GET /status``) or a
status file (``<output stem>_status.json``). Blocking: call it in a thread from a loop."""

from __future__ import annotations

import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

__all__ = ["StatusSource", "StatusUnavailable"]


class StatusUnavailable(Exception):
    """No status could be read; ``str()`` says where from and why."""


@dataclass(frozen=True, slots=True)
class StatusSource:
    """Exactly one of ``head_url`` and ``path``."""

    head_url: str | None = None
    path: Path | None = None
    timeout_s: float = 5.0

    def __post_init__(self) -> None:
        if (self.head_url is None) == (self.path is None):
            raise ValueError("a status source is a head server URL or a status file, not both")

    def __str__(self) -> str:
        if self.head_url is not None:
            return f"{self.head_url.rstrip('/')}/status"
        return str(self.path)

    def fetch(self) -> list[dict[str, Any]]:
        """The runs' status documents, the most recently updated first (a file holds one)."""
        if self.path is not None:
            try:
                data = self.path.read_bytes()
            except FileNotFoundError:
                raise StatusUnavailable(f"{self.path}: no status file (yet)") from None
            except OSError as exc:
                raise StatusUnavailable(f"{self.path}: {exc.strerror or exc}") from None
            return [self._document(data)]
        url = f"{str(self.head_url).rstrip('/')}/status"
        try:
            with urllib.request.urlopen(url, timeout=self.timeout_s) as response:
                data = response.read()
        except urllib.error.HTTPError as exc:
            raise StatusUnavailable(f"{url}: HTTP {exc.code}") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise StatusUnavailable(f"{url}: {reason}") from None
        try:
            runs = orjson.loads(data).get("runs")
        except (orjson.JSONDecodeError, AttributeError):
            raise StatusUnavailable(f"{url}: not a head server's status answer") from None
        if not isinstance(runs, list):
            raise StatusUnavailable(f"{url}: not a head server's status answer")
        return [run for run in runs if isinstance(run, dict)]

    def _document(self, data: bytes) -> dict[str, Any]:
        try:
            document = orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            raise StatusUnavailable(f"{self.path}: not a status document ({exc})") from None
        if not isinstance(document, dict) or "run" not in document:
            raise StatusUnavailable(f"{self.path}: not a status document")
        return document
