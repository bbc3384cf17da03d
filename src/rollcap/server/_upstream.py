"""Upstream backends: where a model type sends a call, and with which credentials.

A backend only decides the URL and the headers. Forwarding itself (one shared aiohttp session,
bytes passed through untouched) is the same for every pass-through model type.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from rollcap._proxy.headers import CREDENTIAL_HEADERS, HOP_BY_HOP

__all__ = ["LOCAL_MODEL", "MODEL_TYPES", "Backend", "backend_for"]


@dataclass(frozen=True, slots=True)
class Backend:
    """How one model type reaches its upstream."""

    model_type: str
    base_url: str
    api_key: str | None
    auth_header: str  # "authorization" (Bearer), "x-api-key" or "api-key"
    pass_client_credentials: bool = False
    query: str = ""  # e.g. Azure's api-version
    # The upstream speaks only Chat Completions: Responses and Messages calls are translated.
    translate_to_chat: bool = False

    def url_for(self, path: str) -> str:
        """Join ``path`` (``/v1/...``) to the base URL, with or without a trailing ``/v1``."""
        base = self.base_url.rstrip("/")
        if base.endswith("/v1") and path.startswith("/v1/"):
            path = path[3:]
        return base + path + (f"?{self.query}" if self.query else "")

    def headers(self, client_headers: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        for name, value in client_headers:
            lower = name.lower()
            if lower in HOP_BY_HOP:
                continue
            if lower in CREDENTIAL_HEADERS and not self.pass_client_credentials:
                continue
            out.append((name, value))
        # The capture parses what comes back, and the client must get the same bytes.
        out.append(("accept-encoding", "identity"))
        if self.api_key and not self.pass_client_credentials:
            if self.auth_header == "authorization":
                out.append(("authorization", f"Bearer {self.api_key}"))
            else:
                out.append((self.auth_header, self.api_key))
        return out


MODEL_TYPES = ("openai_model", "vllm_model", "anthropic_model", "azure_openai_model", "local_model")
# The embedded model: its chat server listens at an address known only once the model server's
# lifespan has started it (see ``_app``), so the backend's base URL is filled in then.
LOCAL_MODEL = "local_model"


def backend_for(
    model_type: str,
    *,
    base_url: str | None,
    api_key: str | None,
    pass_client_credentials: bool = False,
    extra: Mapping[str, str] | None = None,
) -> Backend:
    """The backend of a model type; a clear ``ValueError`` for what cannot work."""
    if model_type not in MODEL_TYPES:
        raise ValueError(
            f"unknown or not yet supported model type {model_type!r}: "
            f"expected one of {', '.join(MODEL_TYPES)}"
        )
    if model_type == LOCAL_MODEL:
        from rollcap.local import require_local_model

        require_local_model()  # fail now, naming the install, rather than at the first call
        return Backend(model_type, "", None, "authorization", translate_to_chat=True)
    if not base_url:
        raise ValueError(f"model type {model_type} needs policy_base_url (the upstream's URL)")
    if not base_url.startswith(("http://", "https://")):
        raise ValueError(f"policy_base_url {base_url!r} must start with http:// or https://")
    extra = extra or {}
    if model_type == "anthropic_model":
        return Backend(model_type, base_url, api_key, "x-api-key", pass_client_credentials)
    if model_type == "azure_openai_model":
        version = extra.get("api_version", "2024-10-21")
        return Backend(
            model_type,
            base_url,
            api_key,
            "api-key",
            pass_client_credentials,
            f"api-version={version}",
        )
    return Backend(
        model_type,
        base_url,
        api_key,
        "authorization",
        pass_client_credentials,
        translate_to_chat=model_type == "vllm_model",
    )
