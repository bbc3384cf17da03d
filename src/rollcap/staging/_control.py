"""The ledger's control route, as the trainer reads it (STAGING §8.2).

The model server serves each rollout's manifest at ``GET
/training-token-capture/control/rollouts/{rollout_id}/manifest`` behind a bearer token;
:class:`RolloutControlClient` is the trainer's side, :func:`bearer_matches` the server's check.

Importing this module does not import aiohttp: the server side needs only the token check, and
the package stays free of the HTTP stack until a client is used.
"""

from __future__ import annotations

import hmac
import math
from types import TracebackType
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import orjson

from rollcap.staging._records import RolloutManifest

if TYPE_CHECKING:
    import aiohttp

__all__ = [
    "DEFAULT_CONTROL_TOKEN_ENV",
    "MANIFEST_PATH_TEMPLATE",
    "RolloutControlClient",
    "bearer_matches",
    "manifest_path",
]

MANIFEST_PATH_TEMPLATE = "/training-token-capture/control/rollouts/{rollout_id}/manifest"
DEFAULT_CONTROL_TOKEN_ENV = "NEMO_GYM_TOKEN_CAPTURE_CONTROL_TOKEN"

# How much of a refusing answer's body an error message quotes.
_BODY_QUOTE_CHARS = 2000


def manifest_path(rollout_id: str) -> str:
    """The manifest route's path for ``rollout_id``, which is inserted as given (not escaped)."""
    return MANIFEST_PATH_TEMPLATE.format(rollout_id=rollout_id)


def bearer_matches(header_value: str | None, token: str) -> bool:
    """Whether an ``Authorization`` header is exactly ``"Bearer " + token``.

    Compared in constant time (for equal lengths). A missing header, or an empty ``token``,
    never matches.
    """
    if header_value is None or not token:
        return False
    # Bytes, so that a header with non-ASCII characters compares (and fails) rather than raises.
    return hmac.compare_digest(
        header_value.encode("utf-8", "surrogatepass"),
        f"Bearer {token}".encode("utf-8", "surrogatepass"),
    )


class RolloutControlClient:
    """Reads rollout manifests from a model server's control route, over one aiohttp session.

    ``base_url`` is the model server's origin (an ``http`` or ``https`` URL; a trailing ``/`` is
    dropped); ``auth_token`` the control token (non-empty); ``request_timeout_s`` the limit of
    one whole request (positive and finite). Any other value raises ``ValueError``. The session
    is opened on the first request and closed by :meth:`close` or on leaving ``async with``;
    a closed client refuses further requests with ``RuntimeError``.
    """

    def __init__(self, base_url: str, *, auth_token: str, request_timeout_s: float) -> None:
        if not isinstance(auth_token, str) or not auth_token:
            raise ValueError("the control client needs a non-empty auth token")
        if (
            isinstance(request_timeout_s, bool)
            or not isinstance(request_timeout_s, int | float)
            or not math.isfinite(request_timeout_s)
            or request_timeout_s <= 0
        ):
            raise ValueError(
                f"request_timeout_s must be a positive number of seconds, not {request_timeout_s!r}"
            )
        if not isinstance(base_url, str):
            raise ValueError(f"the control base URL must be a string, not {base_url!r}")
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"the control base URL must be an http(s) URL, not {base_url!r}")
        self._base_url = base_url.rstrip("/")
        self._token = auth_token
        self._timeout_s = request_timeout_s
        self._session: aiohttp.ClientSession | None = None
        self._closed = False

    @property
    def base_url(self) -> str:
        """The base URL requests are made under, without a trailing ``/``."""
        return self._base_url

    def manifest_url(self, rollout_id: str) -> str:
        """The URL :meth:`manifest` GETs for ``rollout_id``."""
        return self._base_url + manifest_path(rollout_id)

    async def manifest(self, rollout_id: str) -> RolloutManifest:
        """The manifest of ``rollout_id`` as the server's ledger has it now.

        Raises ``RuntimeError`` when the request exceeds the timeout (``ledger control request
        GET <url> exceeded <t>s``), cannot be made (connection refused, ...), is answered with
        a status other than 200 (the message quotes the status and the body), or is answered
        with a body that is not JSON or is the manifest of another rollout; a JSON body that is
        no valid manifest raises pydantic's ``ValidationError`` (a ``ValueError``).
        """
        import aiohttp

        url = self.manifest_url(rollout_id)
        session = self._open_session()
        try:
            async with session.get(
                url,
                headers={"Authorization": f"Bearer {self._token}"},
                timeout=aiohttp.ClientTimeout(total=self._timeout_s),
                allow_redirects=False,
            ) as response:
                status = response.status
                body = await response.read()
        except TimeoutError:
            raise RuntimeError(
                f"ledger control request GET {url} exceeded {self._timeout_s}s"
            ) from None
        except aiohttp.ClientError as exc:
            raise RuntimeError(f"ledger control request GET {url} failed: {exc!r}") from exc
        if status != 200:
            text = body.decode("utf-8", "replace")[:_BODY_QUOTE_CHARS]
            raise RuntimeError(f"ledger control request GET {url} answered {status}: {text}")
        try:
            data = orjson.loads(body)
        except orjson.JSONDecodeError:
            text = body.decode("utf-8", "replace")[:_BODY_QUOTE_CHARS]
            raise RuntimeError(
                f"ledger control request GET {url} answered 200 with a body that is not JSON: "
                f"{text}"
            ) from None
        manifest = RolloutManifest.model_validate(data)
        if manifest.rollout_id != rollout_id:
            raise RuntimeError(
                f"ledger control request GET {url} answered the manifest of rollout "
                f"{manifest.rollout_id!r}"
            )
        return manifest

    def _open_session(self) -> aiohttp.ClientSession:
        import aiohttp

        if self._closed:
            raise RuntimeError("the rollout control client is closed")
        if self._session is None:
            # Created on first use: a session belongs to the event loop it was made in.
            self._session = aiohttp.ClientSession()
        return self._session

    async def close(self) -> None:
        """Close the session; idempotent. The client refuses requests afterwards."""
        self._closed = True
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    async def __aenter__(self) -> RolloutControlClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()
