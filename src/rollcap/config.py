"""Configuration: YAML files, then ``env.yaml``, then command-line overrides; validated once.

Overrides follow the usual three forms: ``key=value`` changes a key that exists, ``+key=value``
adds one that does not, ``++key=value`` adds or changes. Keys are dotted for nesting and values
are typed as YAML reads them (``true``, ``3``, ``0.5``, ``null``, ``[a, b]``), so
``++observability_enabled=true`` is the bool, not the string.

Every problem is a ``ConfigError`` whose message names the key or file: the CLI prints it on one
line and exits 2 before anything starts.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from rollcap.records import CAPTURE_MAX_RESPONSE_BYTES
from rollcap.status._rules import LiveStatusSettings
from rollcap.store._frames import DEFAULT_LEVEL, MAX_LEVEL, check_level
from rollcap.store._sync import check_sync

__all__ = [
    "CLIENT_SESSION_HEADERS",
    "CREDENTIAL_KEYS",
    "DEFAULTS",
    "HEADER_READ_TIMEOUT_S",
    "MAX_REQUEST_BYTES",
    "WEBSOCKET_MAX_SOCKETS",
    "WEBSOCKET_MAX_STORED_RESPONSES",
    "ConfigError",
    "LiveStatusSettings",
    "RunSettings",
    "apply_override",
    "base_urls",
    "load_config",
    "redact",
]

# A model server answers a longer request body 413.
MAX_REQUEST_BYTES = 100 * 1024 * 1024
# A server closes a connection that takes longer over its request headers.
HEADER_READ_TIMEOUT_S = 30.0
# The request headers a record's client_session_id is read from, first present wins.
CLIENT_SESSION_HEADERS = ("x-session-id",)
# Responses WebSockets a model server holds open at once; past it a handshake is answered 503.
WEBSOCKET_MAX_SOCKETS = 4096
# The responses a translated model server keeps per WebSocket for previous_response_id.
WEBSOCKET_MAX_STORED_RESPONSES = 64

DEFAULTS: dict[str, Any] = {
    "observability_enabled": False,
    "model_call_capture_dir": None,
    "policy_base_url": None,
    "policy_api_key": None,
    "policy_model_name": None,
    # Forward the client's own authorization / x-api-key instead of policy_api_key.
    "pass_client_credentials": False,
    # RL token staging on NeMo Gym 0.7.0's wire (see TokenCaptureSettings and the README).
    "token_id_capture": {"enabled": False, "external_staging": False},
    # Bounds on what one call may cost a model server (see the README's configuration table).
    "max_request_bytes": MAX_REQUEST_BYTES,
    "capture_max_response_bytes": CAPTURE_MAX_RESPONSE_BYTES,
    "header_read_timeout_s": HEADER_READ_TIMEOUT_S,
    "websocket_max_sockets": WEBSOCKET_MAX_SOCKETS,
    "websocket_max_stored_responses": WEBSOCKET_MAX_STORED_RESPONSES,
    # Request headers read as the call's client_session_id, in order: the first present wins.
    "client_session_headers": list(CLIENT_SESSION_HEADERS),
    # With capture on, collection compacts each rollout's capture file into
    # <rollout_id>.capture.jsonl.zst once its line is built, at this Zstandard level (1..22).
    "capture_compress": False,
    # How the model server makes a batch of records durable: auto, fsync or syncfs (the README).
    "capture_sync": "auto",
    "capture_compress_level": DEFAULT_LEVEL,
}
# Keys whose values are secrets wherever they appear in the tree.
CREDENTIAL_KEYS = frozenset({"policy_api_key", "api_key", "apikey", "token", "password", "secret"})
_REDACTED = "<redacted>"


class ConfigError(ValueError):
    """A configuration that cannot be used; the message names what is wrong."""


def _parse_value(key: str, text: str) -> Any:
    try:
        return yaml.safe_load(text) if text != "" else ""
    except yaml.YAMLError as exc:
        raise ConfigError(f"override {key}: value {text!r} is not valid YAML ({exc})") from None


def apply_override(config: dict[str, Any], override: str) -> None:
    """Apply one ``key=value`` / ``+key=value`` / ``++key=value`` to ``config`` in place."""
    mode = "set"
    body = override
    if body.startswith("++"):
        mode, body = "force", body[2:]
    elif body.startswith("+"):
        mode, body = "add", body[1:]
    key, eq, text = body.partition("=")
    if not eq or not key:
        raise ConfigError(
            f"override {override!r} must look like key=value, +key=value or ++key=value"
        )
    parts = key.split(".")
    if any(not part for part in parts):
        raise ConfigError(f"override {override!r}: empty part in dotted key {key!r}")
    node: dict[str, Any] = config
    for depth, part in enumerate(parts[:-1]):
        child = node.get(part)
        if child is None:
            if mode == "set":
                raise ConfigError(
                    f"override {override!r}: no key {'.'.join(parts[: depth + 1])!r} to change "
                    f"(use +{key}=... to add it)"
                )
            child = node[part] = {}
        if not isinstance(child, dict):
            raise ConfigError(
                f"override {override!r}: {'.'.join(parts[: depth + 1])!r} is not a mapping"
            )
        node = child
    last = parts[-1]
    if mode == "set" and last not in node:
        raise ConfigError(
            f"override {override!r}: no key {key!r} to change (use +{key}=... to add it)"
        )
    if mode == "add" and last in node:
        raise ConfigError(f"override {override!r}: key {key!r} exists already (use ++{key}=...)")
    node[last] = _parse_value(key, text)


def _merge(base: dict[str, Any], extra: Mapping[str, Any]) -> None:
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(base.get(key), dict):
            _merge(base[key], value)
        else:
            base[key] = copy.deepcopy(value)


def _load_yaml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"config file {path}: {exc.strerror or exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path}: not valid YAML ({exc})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path}: the top level must be a mapping")
    return data


def load_config(
    files: Iterable[str | os.PathLike[str]] = (),
    overrides: Sequence[str] = (),
    *,
    env_file: str | os.PathLike[str] | None = "env.yaml",
) -> dict[str, Any]:
    """Defaults, then each YAML file, then ``env_file`` if it exists, then the overrides."""
    config = copy.deepcopy(DEFAULTS)
    for file in files:
        _merge(config, _load_yaml(Path(file)))
    if env_file is not None and Path(env_file).is_file():
        _merge(config, _load_yaml(Path(env_file)))
    for override in overrides:
        apply_override(config, override)
    return config


def redact(value: Any) -> Any:
    """A copy with every credential value replaced, for anything shown or written."""
    if isinstance(value, Mapping):
        return {
            k: (_REDACTED if str(k).lower() in CREDENTIAL_KEYS and v is not None else redact(v))
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [redact(v) for v in value]
    return value


@dataclass(frozen=True, slots=True)
class RunSettings:
    """The global settings every command needs, validated."""

    observability_enabled: bool
    model_call_capture_dir: Path | None
    # Several upstreams: each rollout's calls go to one, chosen by ``rollcap.affinity``.
    policy_base_url: str | tuple[str, ...] | None
    policy_api_key: str | None
    policy_model_name: str | None
    pass_client_credentials: bool = False
    token_capture: TokenCaptureSettings = field(default_factory=lambda: TokenCaptureSettings())
    max_request_bytes: int = MAX_REQUEST_BYTES
    capture_max_response_bytes: int = CAPTURE_MAX_RESPONSE_BYTES
    header_read_timeout_s: float = HEADER_READ_TIMEOUT_S
    client_session_headers: tuple[str, ...] = CLIENT_SESSION_HEADERS
    live_status: LiveStatusSettings = field(default_factory=LiveStatusSettings)
    websocket_max_sockets: int = WEBSOCKET_MAX_SOCKETS
    websocket_max_stored_responses: int = WEBSOCKET_MAX_STORED_RESPONSES
    capture_compress: bool = False
    capture_compress_level: int = DEFAULT_LEVEL
    capture_sync: str = "auto"

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> RunSettings:
        enabled = config.get("observability_enabled", False)
        if not isinstance(enabled, bool):
            raise ConfigError(f"observability_enabled must be true or false, got {enabled!r}")
        raw_dir = config.get("model_call_capture_dir")
        capture_dir: Path | None = None
        if raw_dir is not None:
            if not isinstance(raw_dir, str) or not raw_dir:
                raise ConfigError(f"model_call_capture_dir must be a path, got {raw_dir!r}")
            if not Path(raw_dir).is_absolute():
                raise ConfigError(
                    f"model_call_capture_dir must be an absolute path, got {raw_dir!r}"
                )
            capture_dir = Path(raw_dir)
        if enabled and capture_dir is None:
            raise ConfigError(
                "model_call_capture_dir is required when observability_enabled is true"
            )

        def _opt_str(key: str) -> str | None:
            value = config.get(key)
            if value is not None and not isinstance(value, str):
                raise ConfigError(f"{key} must be a string, got {type(value).__name__}")
            return value

        passthrough = config.get("pass_client_credentials", False)
        if not isinstance(passthrough, bool):
            raise ConfigError(f"pass_client_credentials must be true or false, got {passthrough!r}")
        compress = config.get("capture_compress", False)
        if not isinstance(compress, bool):
            raise ConfigError(f"capture_compress must be true or false, got {compress!r}")
        try:
            sync = check_sync(config.get("capture_sync", "auto"), "capture_sync")
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        token_capture = TokenCaptureSettings.from_config(
            config.get("token_id_capture"), capture_dir
        )
        timeout = config.get("header_read_timeout_s", HEADER_READ_TIMEOUT_S)
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0:
            raise ConfigError(f"header_read_timeout_s must be a positive number, got {timeout!r}")
        return cls(
            max_request_bytes=_byte_count(config, "max_request_bytes", MAX_REQUEST_BYTES),
            capture_max_response_bytes=_byte_count(
                config, "capture_max_response_bytes", CAPTURE_MAX_RESPONSE_BYTES
            ),
            header_read_timeout_s=float(timeout),
            websocket_max_sockets=_count(config, "websocket_max_sockets", WEBSOCKET_MAX_SOCKETS),
            websocket_max_stored_responses=_count(
                config, "websocket_max_stored_responses", WEBSOCKET_MAX_STORED_RESPONSES
            ),
            client_session_headers=_header_names(
                config.get("client_session_headers", list(CLIENT_SESSION_HEADERS))
            ),
            token_capture=token_capture,
            live_status=_live_status(config.get("live_status")),
            pass_client_credentials=passthrough,
            capture_compress=compress,
            capture_sync=sync,
            capture_compress_level=_compress_level(config),
            observability_enabled=enabled,
            model_call_capture_dir=capture_dir,
            policy_base_url=base_urls("policy_base_url", config.get("policy_base_url")),
            policy_api_key=_opt_str("policy_api_key"),
            policy_model_name=_opt_str("policy_model_name"),
        )

    @property
    def capture_dir(self) -> Path | None:
        """Where to capture, or None when capture is off."""
        return self.model_call_capture_dir if self.observability_enabled else None

    @property
    def compress_capture_level(self) -> int | None:
        """The level collection compacts each rollout's capture at; None when it does not
        (``capture_compress`` off, or capture off: then there is nothing to compact)."""
        if not self.capture_compress or self.capture_dir is None:
            return None
        return self.capture_compress_level


def _compress_level(config: Mapping[str, Any]) -> int:
    value = config.get("capture_compress_level", DEFAULT_LEVEL)
    try:
        return check_level(value)
    except ValueError:
        raise ConfigError(
            f"capture_compress_level must be a whole number from 1 to {MAX_LEVEL}, got {value!r}"
        ) from None


def _live_status(raw: object) -> LiveStatusSettings:
    try:
        return LiveStatusSettings.from_config(raw)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _header_names(raw: object) -> tuple[str, ...]:
    """``client_session_headers``: header names, lower-cased as HTTP compares them."""
    if isinstance(raw, str):
        raw = [raw]
    if not isinstance(raw, list | tuple) or not all(
        isinstance(name, str) and name.strip() for name in raw
    ):
        raise ConfigError(f"client_session_headers must be a list of header names, got {raw!r}")
    return tuple(name.strip().lower() for name in raw)


def _count(
    config: Mapping[str, Any], key: str, default: int, what: str = "a whole number of at least 1"
) -> int:
    value = config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{key} must be {what}, got {value!r}")
    return value


def _byte_count(config: Mapping[str, Any], key: str, default: int) -> int:
    return _count(config, key, default, "a positive whole number of bytes")


def base_urls(key: str, raw: object) -> str | tuple[str, ...] | None:
    """A URL, or a list of URLs (a tuple; one URL alone is kept a string); ``None`` stays."""
    if raw is None or (isinstance(raw, str) and raw):
        return raw
    if isinstance(raw, list | tuple) and raw and all(isinstance(u, str) and u for u in raw):
        return raw[0] if len(raw) == 1 else tuple(raw)
    raise ConfigError(f"{key} must be a URL or a non-empty list of URLs, got {raw!r}")


def _absolute_dir(key: str, raw: object) -> Path:
    if not isinstance(raw, str) or not raw:
        raise ConfigError(f"{key} must be a path, got {raw!r}")
    if not Path(raw).is_absolute():
        raise ConfigError(f"{key} must be an absolute path, got {raw!r}")
    return Path(raw)


# The keys of NeMo Gym 0.7.0's block; anything else is refused, as there.
_TOKEN_CAPTURE_KEYS = (
    "enabled",
    "all_agents",
    "dir",
    "sink",
    "sink_kwargs",
    "lineage_store",
    "lineage_store_kwargs",
    "rebuild_response",
    "allow_unresolved_continuations",
    "delta_records",
    "max_mask_fraction",
    "mask_fraction_min_samples",
    "external_staging",
    "external_staging_backend",
    "control_auth_token_env",
)
# Keys of the built-in (Gym-finalized) path, which rollcap does not run: accepted at their
# defaults so that one file configures both, refused when set.
_BUILT_IN_ONLY = (
    "sink",
    "sink_kwargs",
    "lineage_store",
    "lineage_store_kwargs",
    "delta_records",
    "max_mask_fraction",
    "mask_fraction_min_samples",
    "allow_unresolved_continuations",
)
STAGING_BACKENDS = ("vllm_worker", "megatron_worker")
DEFAULT_CONTROL_TOKEN_ENV = "NEMO_GYM_TOKEN_CAPTURE_CONTROL_TOKEN"


@dataclass(frozen=True, slots=True)
class TokenCaptureSettings:
    """The ``token_id_capture`` block: RL token staging through a capture worker.

    ``external_staging`` on means the model server is the gate of STAGING: training calls
    (``/ng-rollout/<id>/training-token-capture/...``) are admitted, the worker stages them, and
    a token-free ledger under ``dir`` (default ``model_call_capture_dir``) lists them for the
    control route. ``all_agents`` makes every agent send its model calls as training calls.
    """

    enabled: bool = False
    all_agents: bool = False
    dir: Path | None = None
    external_staging: bool = False
    external_staging_backend: str = "vllm_worker"
    control_auth_token_env: str = DEFAULT_CONTROL_TOKEN_ENV

    @classmethod
    def from_config(cls, section: object, capture_dir: Path | None) -> TokenCaptureSettings:
        if section is None:
            return cls()
        if not isinstance(section, Mapping):
            raise ConfigError(f"token_id_capture must be a mapping, got {type(section).__name__}")
        unknown = sorted(str(k) for k in section if k not in _TOKEN_CAPTURE_KEYS)
        if unknown:
            raise ConfigError(
                f"token_id_capture: unknown key(s) {', '.join(unknown)}; known: "
                + ", ".join(_TOKEN_CAPTURE_KEYS)
            )

        def flag(key: str, default: bool) -> bool:
            value = section.get(key, default)
            if value is None:
                return default
            if not isinstance(value, bool):
                raise ConfigError(f"token_id_capture.{key} must be true or false, got {value!r}")
            return value

        for key in _BUILT_IN_ONLY:
            if section.get(key) not in (None, False, {}):
                raise ConfigError(
                    f"token_id_capture.{key} configures the built-in token capture path, which "
                    "rollcap does not run: rollcap stages through a capture worker "
                    "(external_staging: true)"
                )
        enabled = flag("enabled", False)
        external = flag("external_staging", False)
        rebuild = flag("rebuild_response", True)
        backend = section.get("external_staging_backend") or "vllm_worker"
        if backend not in STAGING_BACKENDS:
            raise ConfigError(
                "token_id_capture.external_staging_backend must be one of "
                f"{', '.join(STAGING_BACKENDS)}, got {backend!r}"
            )
        token_env = section.get("control_auth_token_env") or DEFAULT_CONTROL_TOKEN_ENV
        if not isinstance(token_env, str):
            raise ConfigError(
                "token_id_capture.control_auth_token_env must be a variable name, got "
                f"{token_env!r}"
            )
        raw_dir = section.get("dir")
        directory = _absolute_dir("token_id_capture.dir", raw_dir) if raw_dir is not None else None
        if external:
            if not enabled:
                raise ConfigError("token_id_capture.external_staging requires enabled: true")
            if rebuild:
                # The framework owns finalization: the gate must not rebuild the response.
                raise ConfigError(
                    "token_id_capture.external_staging requires rebuild_response: false"
                )
            directory = directory or capture_dir
            if directory is None:
                raise ConfigError(
                    "token_id_capture.dir (or model_call_capture_dir) is required when "
                    "token_id_capture.external_staging is true: the ledger lives there"
                )
        elif backend != "vllm_worker":
            raise ConfigError("token_id_capture.external_staging_backend requires external_staging")
        elif enabled:
            raise ConfigError(
                "token_id_capture.enabled without external_staging is the built-in token capture "
                "path, which rollcap does not run: set external_staging: true and "
                "rebuild_response: false, with a capture worker as the upstream"
            )
        return cls(
            enabled=enabled,
            all_agents=flag("all_agents", False),
            dir=directory,
            external_staging=external,
            external_staging_backend=backend,
            control_auth_token_env=token_env,
        )
