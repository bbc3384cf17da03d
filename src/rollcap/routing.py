"""The ``/ng-rollout/<rollout_id>/`` URL prefix: parse, strip and apply.

The prefix is how a model call says which rollout it belongs to. A model server (and an agent's
self-call route) strips it before routing (``strip_prefix``); agents add it to their outgoing
model calls. After the id, an optional ``/training-token-capture`` segment marks an RL training
call: only such a call has its token ids staged (STAGING §8.1); it is stripped with the prefix
and kept in the scope, and carried onto an agent's onward calls. Everything here is pure string
work.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from typing import Any

from rollcap.ids import rollout_id_from_run, validate_rollout_id

__all__ = [
    "ROLLOUT_PREFIX",
    "SCOPE_ROLLOUT_ID_KEY",
    "SCOPE_TRAINING_KEY",
    "TRAINING_SEGMENT",
    "apply_prefix",
    "base_url_for_run",
    "split_prefix",
    "strip_prefix",
    "url_path_for_request",
    "url_path_for_run",
]

ROLLOUT_PREFIX = "/ng-rollout/"
# Where the model and agent servers keep the stripped rollout id in the ASGI scope, so a handler
# behind the stripping middleware can still carry it onwards.
SCOPE_ROLLOUT_ID_KEY = "rollcap.rollout_id"
# The path segment of a training call, and the scope key that says a call was sent with it.
TRAINING_SEGMENT = "/training-token-capture"
SCOPE_TRAINING_KEY = "rollcap.training_token_capture"


def _training_rest(rest: str) -> tuple[bool, str]:
    """Whether the rest of a prefixed path starts with the training segment, and what follows."""
    if rest.startswith(TRAINING_SEGMENT) and rest[
        len(TRAINING_SEGMENT) : len(TRAINING_SEGMENT) + 1
    ] in ("", "/"):
        return True, rest[len(TRAINING_SEGMENT) :] or "/"
    return False, rest


def split_prefix(path: str) -> tuple[str | None, str]:
    """Split ``/ng-rollout/<id>/rest`` into ``(id, "/rest")``; other paths give ``(None, path)``.

    A path that starts with the prefix but carries an invalid id raises ``ValueError``: a server
    answers it with 400 instead of routing it as an unprefixed call.
    """
    if not path.startswith(ROLLOUT_PREFIX):
        return None, path
    rest = path[len(ROLLOUT_PREFIX) :]
    rollout_id, slash, tail = rest.partition("/")
    validate_rollout_id(rollout_id)
    return rollout_id, (slash + tail) or "/"


def strip_prefix(scope: MutableMapping[str, Any]) -> tuple[str | None, MutableMapping[str, Any]]:
    """``(rollout_id, child scope)`` of an ASGI HTTP scope; ``(None, scope)`` without a prefix.

    The child scope is what a mounted sub-application gets: the bare path (``path`` and
    ``raw_path``) to route on, and the id under ``SCOPE_ROLLOUT_ID_KEY``. The id is read from
    the path as sent: in the decoded path ``a%2Fb`` would pass as the id ``a`` followed by
    ``/b``. An invalid id raises ``ValueError`` (a server answers 400).
    """
    raw_path = scope.get("raw_path")
    sent = raw_path.decode("latin-1") if raw_path else scope["path"]
    rollout_id, _ = split_prefix(sent)
    if rollout_id is None:
        return None, scope
    # A valid id has no escapes, so the decoded path carries the same prefix.
    training, path = _training_rest(scope["path"][len(ROLLOUT_PREFIX) + len(rollout_id) :] or "/")
    child = {
        **scope,
        "path": path,
        "raw_path": path.encode(),
        SCOPE_ROLLOUT_ID_KEY: rollout_id,
        SCOPE_TRAINING_KEY: training,
    }
    return rollout_id, child


def apply_prefix(url_path: str, rollout_id: str, *, training: bool = False) -> str:
    """``/ng-rollout/<id>`` (then ``/training-token-capture`` for a training call) +
    ``url_path``; ``url_path`` must start with ``/``."""
    validate_rollout_id(rollout_id)
    if not url_path.startswith("/"):
        raise ValueError(f"url path {url_path!r} must start with '/'")
    if url_path.startswith(ROLLOUT_PREFIX):
        raise ValueError(f"url path {url_path!r} already carries a rollout prefix")
    segment = TRAINING_SEGMENT if training else ""
    return f"{ROLLOUT_PREFIX}{rollout_id}{segment}{url_path}"


def url_path_for_run(url_path: str, body: object, *, training: bool = False) -> str:
    """Prefix ``url_path`` with the run body's rollout id (and the training segment when
    ``training``), or return it unchanged if the body has none."""
    rollout_id = rollout_id_from_run(body)
    return url_path if rollout_id is None else apply_prefix(url_path, rollout_id, training=training)


def base_url_for_run(base_url: str, body: object, *, training: bool = False) -> str:
    """``base_url`` with the rollout prefix (and the training segment when ``training``), for
    SDK clients configured once (caller adds /v1)."""
    rollout_id = rollout_id_from_run(body)
    if rollout_id is None:
        return base_url
    segment = TRAINING_SEGMENT if training else ""
    return base_url.rstrip("/") + ROLLOUT_PREFIX + validate_rollout_id(rollout_id) + segment


def _training_of_path(path: str) -> bool:
    rollout_id, rest = split_prefix(path)
    return rollout_id is not None and _training_rest(rest)[0]


def _rollout_of_request(request: object) -> tuple[str | None, bool]:
    scope: Any = getattr(request, "scope", request)
    if isinstance(scope, Mapping):
        stored = scope.get(SCOPE_ROLLOUT_ID_KEY)
        if stored is not None:
            return validate_rollout_id(stored), scope.get(SCOPE_TRAINING_KEY) is True
        path = str(scope.get("root_path", "")) + str(scope.get("path", ""))
        return split_prefix(path)[0], _training_of_path(path)
    if isinstance(request, str):
        return split_prefix(request)[0], _training_of_path(request)
    url = getattr(request, "url", None)
    url_path = getattr(url, "path", None)
    if isinstance(url_path, str):
        return split_prefix(url_path)[0], _training_of_path(url_path)
    return None, False


def url_path_for_request(url_path: str, request: object) -> str:
    """Carry an inbound prefixed self-call's rollout id (and its training segment) onto an
    outgoing call's path.

    ``request`` may be a Starlette request, an ASGI scope, or the inbound path itself. When the
    inbound call carried no prefix, ``url_path`` is returned unchanged.
    """
    rollout_id, training = _rollout_of_request(request)
    if rollout_id is None:
        return url_path
    return apply_prefix(url_path, rollout_id, training=training)
