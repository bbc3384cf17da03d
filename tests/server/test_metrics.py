"""``GET /metrics`` of a model server, parsed by prometheus_client's own parser: its counters
equal the records written."""

from __future__ import annotations

from pathlib import Path

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from rollcap.testing import FakeUpstream
from tests.server.conftest import client_headers, model_server, request_body, settings_for


async def test_metrics_count_the_calls_and_the_records_written(
    upstream: FakeUpstream, tmp_path: Path
) -> None:
    capture = tmp_path / "model-calls"
    async with (
        model_server(settings_for(upstream.url, capture)) as url,
        aiohttp.ClientSession() as s,
    ):
        for i in range(3):
            async with s.post(
                url + f"/ng-rollout/{i}-0/v1/chat/completions",
                json=request_body("chat", stream=i == 0),
                headers=client_headers("chat"),
            ) as response:
                await response.read()
        async with s.post(
            url + "/ng-rollout/9-0/v1/chat/completions",
            json=request_body("chat", stream=False),
            headers=client_headers("chat", "http_500"),
        ) as response:
            assert response.status == 500
        async with s.get(url + "/metrics") as response:
            assert response.status == 200
            text = await response.text()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    calls = {
        (m.labels["status_class"], m.labels["error_category"]): m.value
        for m in families["rollcap_model_calls"].samples
        if m.name == "rollcap_model_calls_total"
    }
    assert calls == {("2xx", "none"): 3.0, ("5xx", "upstream_error"): 1.0}
    records = sum(len(p.read_text().splitlines()) for p in capture.glob("*.jsonl"))
    assert records == 4
    (written,) = [
        m.value
        for m in families["rollcap_capture_records_written"].samples
        if m.name.endswith("_total")
    ]
    assert written == records
    fsyncs = [
        m for m in families["rollcap_capture_fsync_seconds"].samples if m.name.endswith("_count")
    ]
    assert fsyncs[0].value >= 1
    phases = {m.labels["phase"]: m.value for m in families["rollcap_model_calls_in_flight"].samples}
    assert set(phases.values()) == {0.0}
    assert "rollout_id" not in text
    assert "0-0" not in text
