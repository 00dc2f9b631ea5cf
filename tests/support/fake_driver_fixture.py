"""The `fake` fixture: a FakeDriver (tools/fake_driver.py) in place of cuda.bindings.driver for one
test.  `fake(cc=(9, 0), **kw)` makes one with that compute capability and options and installs it
(coppelius.driver.calls's `_cu`, restored after the test); a test module takes the fixture by importing it."""
import pytest

from coppelius.driver import calls as drv
from coppelius.staging.views import StagingViews
from tools.fake_driver import FakeDriver


@pytest.fixture
def fake(monkeypatch):
    def make(cc=(9, 0), **kw):
        f = FakeDriver(cc=cc, **kw)
        monkeypatch.setattr(drv, "_cu", f)
        return f
    return make


def install_for_runs(monkeypatch) -> FakeDriver:
    """A FakeDriver under the cuda backend for whole runs: installed, and its records pass the
    marker check (the fake runs the releases only, so no kernel overwrites a marker)."""
    f = FakeDriver()
    monkeypatch.setattr(drv, "_cu", f)
    monkeypatch.setattr(StagingViews, "marker_survived", lambda self, offset: False)
    return f
