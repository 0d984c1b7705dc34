"""Suite-wide fixtures: every test starts from the same global random state.

torch 2.x seeds its global generator differently in every process, so a test that draws from
it (``torch.randn`` without a generator, a module's random features, dropout) would see new
numbers on every run. Seeding before each test makes every run of the suite see the same ones.

Without CUDA, Triton's kernels run in its interpreter: ``TRITON_INTERPRET=1`` is set here,
before anything imports triton (it reads the setting at import).
"""

from __future__ import annotations

import os
import random

import numpy as np
import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(autouse=True)
def _seed_global_generators() -> None:
    """Seed torch, numpy and ``random`` before every test."""
    torch.manual_seed(0)
    np.random.seed(0)  # noqa: NPY002 (code under test may use the legacy global state)
    random.seed(0)
