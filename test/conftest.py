"""Suite-wide fixtures. Compiled AOTI artifacts are shared through the content-addressed
cache of ``etmetal.backends.aoti_compile`` (under the user cache dir), so each distinct
model compiles once per machine, whichever xdist worker asks first."""

import os

import pytest
import torch


@pytest.fixture(autouse=True)
def _seeded():
    torch.manual_seed(0)
    yield


def pytest_configure(config):
    # one intra-op thread per xdist worker: two workers on two cores
    if os.environ.get("PYTEST_XDIST_WORKER"):
        torch.set_num_threads(1)
