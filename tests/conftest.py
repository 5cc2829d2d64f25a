from __future__ import annotations

import copy

import pytest
from helpers import base_hostvars


@pytest.fixture
def hostvars() -> dict:
    return copy.deepcopy(base_hostvars())
