from __future__ import annotations

from pathlib import Path

import pytest

from rollcap.config import ConfigError, RunSettings, apply_override, load_config, redact
from rollcap.server import ModelServerSettings


def test_override_forms_and_types() -> None:
    config: dict[str, object] = {"a": 1, "nested": {"b": "x"}}
    apply_override(config, "a=2")
    apply_override(config, "nested.b=true")
    apply_override(config, "+c=[1, 2.5, null]")
    apply_override(config, "++d.e.f=/abs/path")
    apply_override(config, "++a=off")
    assert config == {
        "a": False,
        "nested": {"b": True},
        "c": [1, 2.5, None],
        "d": {"e": {"f": "/abs/path"}},
    }


@pytest.mark.parametrize(
    ("override", "match"),
    [
        ("missing=1", "no key 'missing' to change"),
        ("+a=1", "exists already"),
        ("a", "must look like key=value"),
        ("=1", "must look like key=value"),
        ("a..b=1", "empty part"),
        ("a.b=1", "is not a mapping"),
        ("++x=[unclosed", "not valid YAML"),
    ],
)
def test_bad_overrides_name_the_key(override: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        apply_override({"a": 1}, override)


def test_merge_order_files_then_env_then_overrides(tmp_path: Path) -> None:
    first = tmp_path / "one.yaml"
    first.write_text("policy_base_url: http://one\nobservability_enabled: false\nextra: {k: 1}\n")
    second = tmp_path / "two.yaml"
    second.write_text("policy_base_url: http://two\nextra: {j: 2}\n")
    env = tmp_path / "env.yaml"
    env.write_text("policy_api_key: sk-env\npolicy_base_url: http://env\n")
    config = load_config([first, second], ["policy_base_url=http://cli"], env_file=env)
    assert config["policy_base_url"] == "http://cli"
    assert config["policy_api_key"] == "sk-env"
    assert config["extra"] == {"k": 1, "j": 2}
    assert load_config([first], env_file=tmp_path / "absent.yaml")["policy_api_key"] is None


def test_bad_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"nope\.yaml"):
        load_config([tmp_path / "nope.yaml"])
    bad = tmp_path / "bad.yaml"
    bad.write_text("a: [1\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config([bad])
    listing = tmp_path / "list.yaml"
    listing.write_text("- 1\n")
    with pytest.raises(ConfigError, match="must be a mapping"):
        load_config([listing])


def test_run_settings_capture_dir_rules(tmp_path: Path) -> None:
    on = {"observability_enabled": True, "model_call_capture_dir": str(tmp_path)}
    assert RunSettings.from_config(on).capture_dir == tmp_path
    off = {"observability_enabled": False, "model_call_capture_dir": str(tmp_path)}
    assert RunSettings.from_config(off).capture_dir is None
    with pytest.raises(ConfigError, match="model_call_capture_dir is required"):
        RunSettings.from_config({"observability_enabled": True})
    with pytest.raises(ConfigError, match="model_call_capture_dir must be an absolute path"):
        RunSettings.from_config({"observability_enabled": True, "model_call_capture_dir": "rel"})
    with pytest.raises(ConfigError, match="observability_enabled must be true or false"):
        RunSettings.from_config({"observability_enabled": "yes please"})
    with pytest.raises(ConfigError, match="policy_api_key must be a string"):
        RunSettings.from_config({"policy_api_key": 12})


def test_redact_hides_credentials_anywhere() -> None:
    config = {
        "policy_api_key": "sk-1",
        "policy_base_url": "http://x",
        "servers": [{"api_key": "sk-2", "name": "a"}],
        "token": None,
    }
    assert redact(config) == {
        "policy_api_key": "<redacted>",
        "policy_base_url": "http://x",
        "servers": [{"api_key": "<redacted>", "name": "a"}],
        "token": None,
    }


def test_pass_client_credentials_is_a_bool() -> None:
    assert RunSettings.from_config({}).pass_client_credentials is False
    assert RunSettings.from_config({"pass_client_credentials": True}).pass_client_credentials
    with pytest.raises(ConfigError, match="pass_client_credentials must be true or false"):
        RunSettings.from_config({"pass_client_credentials": "yes"})


STAGING_ON = {"enabled": True, "external_staging": True, "rebuild_response": False}


def test_token_capture_settings_are_validated_and_the_ledger_defaults_to_the_capture_dir(
    tmp_path: Path,
) -> None:
    on = {"token_id_capture": STAGING_ON}
    with pytest.raises(ConfigError, match=r"token_id_capture.dir \(or model_call_capture_dir\)"):
        RunSettings.from_config(on)
    with pytest.raises(ConfigError, match=r"dir must be an absolute path"):
        RunSettings.from_config({"token_id_capture": {**STAGING_ON, "dir": "rel/dir"}})
    with pytest.raises(ConfigError, match="external_staging must be true or false"):
        RunSettings.from_config({"token_id_capture": {"external_staging": "yes"}})
    settings = RunSettings.from_config({**on, "model_call_capture_dir": str(tmp_path)})
    assert settings.token_capture.external_staging is True
    assert settings.token_capture.dir == tmp_path  # capture off, yet the ledger has a place
    assert settings.token_capture.external_staging_backend == "vllm_worker"
    assert settings.token_capture.control_auth_token_env == "NEMO_GYM_TOKEN_CAPTURE_CONTROL_TOKEN"
    moved = RunSettings.from_config(
        {"token_id_capture": {**STAGING_ON, "dir": str(tmp_path / "l")}}
    )
    assert moved.token_capture.dir == tmp_path / "l"
    assert RunSettings.from_config({}).token_capture.external_staging is False


@pytest.mark.parametrize(
    ("section", "match"),
    [
        ({"ledger_dir": "/x"}, r"unknown key\(s\) ledger_dir"),
        ({"external_staging": True, "rebuild_response": False}, "requires enabled: true"),
        ({"enabled": True, "external_staging": True}, "requires rebuild_response: false"),
        ({"enabled": True}, "built-in token capture path"),
        ({"external_staging_backend": "megatron_worker"}, "requires external_staging"),
        ({**STAGING_ON, "external_staging_backend": "tpu"}, "must be one of"),
        ({**STAGING_ON, "lineage_store": "m:C"}, "lineage_store configures the built-in"),
        ({**STAGING_ON, "allow_unresolved_continuations": True}, "built-in"),
        ({**STAGING_ON, "control_auth_token_env": 5}, "variable name"),
    ],
)
def test_the_token_capture_block_refuses_what_it_cannot_run(
    section: dict[str, object], match: str, tmp_path: Path
) -> None:
    config = {"token_id_capture": section, "model_call_capture_dir": str(tmp_path)}
    with pytest.raises(ConfigError, match=match):
        RunSettings.from_config(config)


def test_the_token_capture_block_takes_every_key_of_the_wire_at_its_default(
    tmp_path: Path,
) -> None:
    section: dict[str, object] = {
        **STAGING_ON,
        "all_agents": True,
        "dir": str(tmp_path),
        "sink": None,
        "sink_kwargs": {},
        "lineage_store": None,
        "lineage_store_kwargs": None,
        "allow_unresolved_continuations": False,
        "delta_records": None,
        "max_mask_fraction": None,
        "mask_fraction_min_samples": None,
        "external_staging_backend": "megatron_worker",
        "control_auth_token_env": "MY_TOKEN",
    }
    settings = RunSettings.from_config({"token_id_capture": section}).token_capture
    assert settings.all_agents is True
    assert settings.external_staging_backend == "megatron_worker"
    assert settings.control_auth_token_env == "MY_TOKEN"


def test_the_bounds_have_their_defaults_and_take_overrides() -> None:
    settings = RunSettings.from_config(load_config(env_file=None))
    assert settings.max_request_bytes == 100 * 1024 * 1024
    assert settings.capture_max_response_bytes == 64 * 1024 * 1024
    assert settings.header_read_timeout_s == 30.0
    overrides = ["max_request_bytes=1024", "capture_max_response_bytes=2048"]
    overrides.append("header_read_timeout_s=2.5")
    settings = RunSettings.from_config(load_config(overrides=overrides, env_file=None))
    assert (settings.max_request_bytes, settings.capture_max_response_bytes) == (1024, 2048)
    assert settings.header_read_timeout_s == 2.5


def test_the_websocket_bounds_have_their_defaults_and_take_overrides() -> None:
    settings = RunSettings.from_config(load_config(env_file=None))
    assert (settings.websocket_max_sockets, settings.websocket_max_stored_responses) == (4096, 64)
    overrides = ["websocket_max_sockets=8", "websocket_max_stored_responses=2"]
    settings = RunSettings.from_config(load_config(overrides=overrides, env_file=None))
    assert (settings.websocket_max_sockets, settings.websocket_max_stored_responses) == (8, 2)
    served = ModelServerSettings.from_run(settings, "vllm_model")
    assert (served.websocket_max_sockets, served.websocket_max_stored_responses) == (8, 2)


@pytest.mark.parametrize(
    ("override", "match"),
    [
        ("max_request_bytes=0", "max_request_bytes must be a positive whole number of bytes"),
        ("max_request_bytes=1.5", "max_request_bytes must be a positive whole number"),
        ("capture_max_response_bytes=true", "capture_max_response_bytes must be a positive"),
        ("header_read_timeout_s=0", "header_read_timeout_s must be a positive number"),
        ("header_read_timeout_s=soon", "header_read_timeout_s must be a positive number"),
        ("websocket_max_sockets=0", "websocket_max_sockets must be a whole number of at least 1"),
        ("websocket_max_stored_responses=x", "websocket_max_stored_responses must be a whole"),
    ],
)
def test_a_bad_bound_is_a_one_line_error_naming_it(override: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        RunSettings.from_config(load_config(overrides=[override], env_file=None))


def test_client_session_headers_default_to_x_session_id_and_take_a_list() -> None:
    assert RunSettings.from_config({}).client_session_headers == ("x-session-id",)
    overrides = ["client_session_headers=[Session-Id, x-claude-code-session-id, x-session-id]"]
    settings = RunSettings.from_config(load_config(overrides=overrides, env_file=None))
    # Lower-cased, as HTTP compares header names; the order is kept (the first present wins).
    assert settings.client_session_headers == (
        "session-id",
        "x-claude-code-session-id",
        "x-session-id",
    )
    assert RunSettings.from_config({"client_session_headers": "a"}).client_session_headers == ("a",)
    for bad in ([3], [""], {"a": 1}, 5):
        with pytest.raises(ConfigError, match="client_session_headers must be a list of header"):
            RunSettings.from_config({"client_session_headers": bad})


def test_policy_base_url_may_list_several_upstreams() -> None:
    def settings(value: object) -> object:
        return RunSettings.from_config({"policy_base_url": value}).policy_base_url

    assert settings("http://a") == "http://a"
    assert settings(["http://a", "http://b"]) == ("http://a", "http://b")
    assert settings(["http://a"]) == "http://a"
    assert settings(None) is None
    for bad in ([], ["http://a", 3], "", 5):
        with pytest.raises(ConfigError, match="policy_base_url must be a URL or a non-empty list"):
            settings(bad)


def test_capture_compression_is_off_by_default_at_level_3() -> None:
    settings = RunSettings.from_config(load_config(env_file=None))
    assert (settings.capture_compress, settings.capture_compress_level) == (False, 3)
    assert settings.compress_capture_level is None


def test_capture_compression_takes_a_level_and_needs_capture_on() -> None:
    capture = ["++observability_enabled=true", "++model_call_capture_dir=/abs/calls"]
    # The form eval run --compress-capture adds: the keys exist, so a plain override sets them.
    overrides = ["capture_compress=true", "capture_compress_level=19"]
    settings = RunSettings.from_config(load_config(overrides=capture + overrides, env_file=None))
    assert (settings.capture_compress, settings.capture_compress_level) == (True, 19)
    assert settings.compress_capture_level == 19
    # Capture off: nothing is captured, so nothing is compacted.
    settings = RunSettings.from_config(load_config(overrides=overrides, env_file=None))
    assert settings.capture_compress is True
    assert settings.compress_capture_level is None


@pytest.mark.parametrize(
    ("override", "match"),
    [
        ("capture_compress=maybe", "capture_compress must be true or false, got 'maybe'"),
        ("capture_compress=1", "capture_compress must be true or false, got 1"),
        ("capture_compress_level=0", "capture_compress_level must be a whole number from 1 to 22"),
        ("capture_compress_level=23", "capture_compress_level must be a whole number from 1 to"),
        ("capture_compress_level=3.5", "capture_compress_level must be .* to 22, got 3.5"),
        ("capture_compress_level=true", "capture_compress_level must be a whole number from 1"),
        ("capture_compress_level=fast", "capture_compress_level must be a whole number from 1"),
    ],
)
def test_a_bad_compression_setting_is_a_one_line_error_naming_it(override: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        RunSettings.from_config(load_config(overrides=[override], env_file=None))


def test_the_capture_sync_is_auto_by_default_and_reaches_the_model_server() -> None:
    from rollcap.server import ModelServerSettings

    assert RunSettings.from_config(load_config(env_file=None)).capture_sync == "auto"
    run = RunSettings.from_config(load_config(overrides=["capture_sync=fsync"], env_file=None))
    assert run.capture_sync == "fsync"
    assert ModelServerSettings.from_run(run, "openai_model").capture_sync == "fsync"


@pytest.mark.parametrize("value", ["fdatasync", "true", "1"])
def test_a_bad_capture_sync_is_a_one_line_error_naming_the_choices(value: str) -> None:
    with pytest.raises(ConfigError, match="capture_sync must be one of auto, fsync, syncfs, got"):
        RunSettings.from_config(load_config(overrides=[f"capture_sync={value}"], env_file=None))
