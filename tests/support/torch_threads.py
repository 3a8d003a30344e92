"""Suite-wide (registered in tests/conftest.py): the test process's own torch math runs on one thread.

The models the tests run in-process are tiny, and the CPU is small and shared
(the test's own engine, tierd and gateway processes run beside it): split over
more threads, their ops mostly wait on each other, at times for ten times the
work (a transformers reference forward went from 0.5 s to 7 s on two busy
cores). Engines and benches started as processes choose their own threads.
"""

from __future__ import annotations

import sys

import pytest


@pytest.fixture(scope="session", autouse=True)
def torch_on_one_thread():
    """One torch thread for the session, when a collected module imported torch (a run of pure-Python
    tests does not import it for this)."""
    torch = sys.modules.get("torch")
    if torch is None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
