"""Data in the page: escaped so it cannot end its element, packed so it stays small."""

from __future__ import annotations

import base64

import orjson
import pytest

from rollcap.report._embed import REPORT_CSP, pack, render_page, script_json, unpack

HOSTILE = "</script><img src=x onerror=alert(1)><!-- \u2028 \u2029 </SCRIPT>"
TEMPLATE = (
    '<meta http-equiv="Content-Security-Policy" content="{{CSP}}"><title>{{TITLE}}</title>'
    "<style>{{CSS}}</style>"
    '<script type="application/json" id="d">{{DATA}}</script><script>{{JS}}</script>'
)


def test_script_json_cannot_end_its_element_and_reads_back_unchanged() -> None:
    value = {"text": HOSTILE, "list": [HOSTILE], HOSTILE: 1}
    text = script_json(value)
    assert "<" not in text
    assert "\u2028" not in text
    assert "\u2029" not in text
    assert orjson.loads(text) == value


def test_pack_is_gzip_base64_and_deterministic() -> None:
    value = {"calls": [{"text": HOSTILE * 20}] * 50}
    packed = pack(value)
    assert packed == pack(value)  # no timestamp in the gzip header
    assert base64.b64decode(packed)[:2] == b"\x1f\x8b"
    assert unpack(packed) == value
    assert len(packed) < len(orjson.dumps(value)) / 10


def test_render_page_fills_every_placeholder_once() -> None:
    page = render_page(
        TEMPLATE,
        {"css": "body{}", "js": "run()"},
        {"note": "{{JS}} {{DATA}}"},
        csp=REPORT_CSP,
        title='run <"a&b">',
    )
    assert f'content="{REPORT_CSP}"' in page
    assert '<title>run &lt;"a&amp;b"&gt;</title>' in page
    assert '{"note":"{{JS}} {{DATA}}"}' in page  # inserted text is never read as a placeholder
    assert page.count("run()") == 1


def test_render_page_refuses_assets_that_could_end_their_element() -> None:
    with pytest.raises(ValueError, match="JS may not contain"):
        render_page(TEMPLATE, {"css": "", "js": "x = '</script>'"}, {}, csp="", title="")
