"""Settings: sources, validation, and the generated reference staying current."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from aenv.core.settings import Settings, reference_markdown

DOCS = Path(__file__).resolve().parents[2] / "docs" / "config.md"


def test_reference_in_docs_is_current() -> None:
    fix = "run: python -m aenv.core.settings > docs/config.md"
    assert DOCS.read_text() == reference_markdown(), fix


def test_env_and_toml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "aenv.toml"
    config.write_text('listen = "0.0.0.0:4000"\nwarm_pool_size = 0\n')
    monkeypatch.setenv("AENV_CONFIG", str(config))
    monkeypatch.setenv("AENV_WARM_POOL_SIZE", "3")
    settings = Settings()
    assert settings.port == 4000 and settings.host == "0.0.0.0"
    assert settings.warm_pool_size == 3  # the environment wins over the file


def test_bad_values_are_rejected(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AENV_DEFAULT_TIMEOUT_S", "0")
    with pytest.raises(ValidationError):
        Settings()
    monkeypatch.delenv("AENV_DEFAULT_TIMEOUT_S")
    with pytest.raises(ValidationError):
        Settings(runtime="docker")  # type: ignore[arg-type]
