"""Putting data into the page safely and compactly (pure).

The page is one HTML file whose data sits in a ``<script type="application/json">`` element.
Model output is hostile text: inside that element a ``</script>`` would end it early and let
what follows run as markup, and before ES2019 a raw U+2028 or U+2029 ended a JavaScript string.
So every ``<`` and both separators are written as JSON ``\\u`` escapes, which ``JSON.parse``
reads back unchanged.

Bulky parts (the summary columns, each rollout's payloads) are gzip-compressed and base64-encoded:
the browser decodes them with ``DecompressionStream``, only when they are shown.
"""

from __future__ import annotations

import base64
import re
import zlib
from collections.abc import Mapping
from typing import Any

import orjson

__all__ = [
    "REPORT_CSP",
    "VIEW_CSP",
    "pack",
    "render_page",
    "script_json",
    "unpack",
]

# The file may not reach anything outside itself; the served page may also call its own API.
REPORT_CSP = (
    "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:"
)
VIEW_CSP = REPORT_CSP + "; connect-src 'self'"

_UNSAFE = {"<": "\\u003c", "\u2028": "\\u2028", "\u2029": "\\u2029"}
_UNSAFE_PATTERN = re.compile("[<\u2028\u2029]")
_PLACEHOLDER = re.compile(r"\{\{(CSP|TITLE|CSS|DATA|JS)\}\}")
# zlib's gzip container (wbits 16 + 15) writes no timestamp, so the same data packs the same.
_GZIP_WBITS = 31


def script_json(value: Any) -> str:
    """``value`` as JSON that is safe inside a ``<script type="application/json">`` element."""
    text = orjson.dumps(value).decode()
    return _UNSAFE_PATTERN.sub(lambda m: _UNSAFE[m.group()], text)


def pack(value: Any) -> str:
    """``value`` as JSON, gzip-compressed and base64-encoded (plain ASCII, safe to embed)."""
    compressor = zlib.compressobj(6, zlib.DEFLATED, _GZIP_WBITS)
    data = compressor.compress(orjson.dumps(value)) + compressor.flush()
    return base64.b64encode(data).decode("ascii")


def unpack(text: str) -> Any:
    """The value ``pack`` packed."""
    return orjson.loads(zlib.decompress(base64.b64decode(text), _GZIP_WBITS))


def _html_text(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def render_page(
    template: str, assets: Mapping[str, str], data: Any, *, csp: str, title: str
) -> str:
    """The page: ``template`` with its ``{{CSP}}``, ``{{TITLE}}``, ``{{CSS}}``, ``{{JS}}`` and
    ``{{DATA}}`` filled in one pass (so nothing inserted is read as a placeholder).

    ``assets`` holds the ``css`` and ``js`` texts; ``data`` goes in through ``script_json``.
    """
    values = {
        "CSP": csp.replace('"', "&quot;"),
        "TITLE": _html_text(title),
        "CSS": assets["css"],
        "JS": assets["js"],
        "DATA": script_json(data),
    }
    for name in ("CSS", "JS"):
        if "</" in values[name]:
            raise ValueError(f"the page's {name} may not contain '</'")
    return _PLACEHOLDER.sub(lambda m: values[m.group(1)], template)
