"""Upstream backends: where a model type sends a call, and with which credentials.

A backend only decides the URL and the headers. Forwarding itself (one shared aiohttp session,
bytes passed through untouched) is the same for every pass-through model type. With several
upstreams (``policy_base_url`` a list) each rollout's calls go to one of them, chosen by
``rollcap.affinity.choose_replica`` of its rollout id, so an engine keeps a rollout's prefix
cache; a call without a rollout goes to the first.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from rollcap._proxy.headers import outgoing, upstream_url
from rollcap.affinity import choose_replica

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
    # Every upstream when there are several (``base_url`` is the first).
    base_urls: tuple[str, ...] = ()

    def url_for(self, path: str, rollout_id: str | None = None, client_query: str = "") -> str:
        """The upstream URL of ``path``: the configured query first (Azure's api-version), then
        the client's own (the Anthropic SDK's ``beta=true``), as it sent it."""
        base = self.base_url
        if rollout_id is not None and len(self.base_urls) > 1:
            base = choose_replica(rollout_id, self.base_urls)
        query = "&".join(part for part in (self.query, client_query) if part)
        return upstream_url(base, path, query)

    def headers(
        self, client_headers: Iterable[tuple[str, str]], *, content_type: str | None = None
    ) -> list[tuple[str, str]]:
        """The client's headers as they go upstream, with the configured credentials."""
        auth: tuple[str, str] | None = None
        if self.api_key and not self.pass_client_credentials:
            if self.auth_header == "authorization":
                auth = ("authorization", f"Bearer {self.api_key}")
            else:
                auth = (self.auth_header, self.api_key)
        return outgoing(
            client_headers,
            auth=auth,
            pass_client_credentials=self.pass_client_credentials,
            content_type=content_type,
        )


MODEL_TYPES = ("openai_model", "vllm_model", "anthropic_model", "azure_openai_model", "local_model")
# The embedded model: its chat server listens at an address known only once the model server's
# lifespan has started it (see ``_app``), so the backend's base URL is filled in then.
LOCAL_MODEL = "local_model"


def backend_for(
    model_type: str,
    *,
    base_url: str | Sequence[str] | None,
    api_key: str | None,
    pass_client_credentials: bool = False,
    extra: Mapping[str, str] | None = None,
) -> Backend:
    """The backend of a model type; a clear ``ValueError`` for what cannot work.

    ``base_url`` may be several upstreams, each rollout sticking to one.
    """
    if model_type not in MODEL_TYPES:
        raise ValueError(
            f"unknown or not yet supported model type {model_type!r}: "
            f"expected one of {', '.join(MODEL_TYPES)}"
        )
    if model_type == LOCAL_MODEL:
        from rollcap.local import require_local_model

        require_local_model()  # fail now, naming the install, rather than at the first call
        return Backend(model_type, "", None, "authorization", translate_to_chat=True)
    urls = (base_url,) if isinstance(base_url, str) else tuple(base_url or ())
    if not urls or not all(urls):
        raise ValueError(f"model type {model_type} needs policy_base_url (the upstream's URL)")
    for url in urls:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"policy_base_url {url!r} must start with http:// or https://")
    backend = _backend(model_type, urls[0], api_key, pass_client_credentials, extra or {})
    return dataclasses.replace(backend, base_urls=urls) if len(urls) > 1 else backend


def _backend(
    model_type: str,
    base_url: str,
    api_key: str | None,
    pass_client_credentials: bool,
    extra: Mapping[str, str],
) -> Backend:
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
