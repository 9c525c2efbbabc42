from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[3]
GRIDS = ROOT / "configs" / "grids"
REFERENCE = ROOT / "tests" / "data" / "case118_reference.npz"


@pytest.fixture(scope="session")
def ref118():
    """pandapower 3.5.6's case118 network arrays and solution (see tests/data/README.md)."""
    with np.load(REFERENCE) as d:
        return {k: d[k] for k in d.files}
