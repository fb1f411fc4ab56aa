"""The example configurations in config/ stay valid."""

from __future__ import annotations

from pathlib import Path

import pytest

from router.server.config import load_settings

EXAMPLES = sorted((Path(__file__).parents[2] / "config").glob("*.toml"))


def test_there_are_examples() -> None:
    assert EXAMPLES


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_config_loads(path: Path) -> None:
    settings = load_settings(path)
    assert settings.backends
    assert len({b.id for b in settings.backends}) == len(settings.backends)
