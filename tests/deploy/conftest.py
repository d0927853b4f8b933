"""Fixtures for the deployment tests: an isolated Helm home and renders of every scenario."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.deploy import chart


@pytest.fixture(scope="session", autouse=True)
def helm_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Helm reads and writes its cache/config/data homes; keep them out of the user's."""
    home = tmp_path_factory.mktemp("helm-home")
    with pytest.MonkeyPatch.context() as mp:
        for var in ("HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME"):
            mp.setenv(var, str(home / var.lower()))
        yield home


@pytest.fixture(scope="session")
def rendered(helm_home: Path) -> dict[str, chart.Rendered]:
    """Every ci/*-values.yaml scenario rendered once, keyed by scenario name."""
    return {
        path.name.removesuffix("-values.yaml"): chart.render(chart.load_values(path))
        for path in chart.scenarios()
    }


@pytest.fixture(scope="session")
def minimal_values() -> dict:
    return chart.load_values(chart.SCENARIO_DIR / "minimal-values.yaml")
