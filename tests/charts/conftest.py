from __future__ import annotations

from typing import Any

import pytest

from tests.charts.chartlib import VARIANTS


@pytest.fixture(params=sorted(VARIANTS), ids=sorted(VARIANTS))
def variant(request: pytest.FixtureRequest) -> tuple[str, dict[str, Any]]:
    """(name, values) for each value set in chartlib.VARIANTS."""
    return request.param, VARIANTS[request.param]
