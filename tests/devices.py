"""The devices of the GPU test set: every test parametrised by `DEVICES` runs on the CPU, and on
CUDA when the machine has it. The `cuda` case carries the `gpu` marker, which tests/conftest.py
skips without CUDA: `make test` (CPU) runs the `cpu` cases, `pytest -m gpu` on a GPU machine the
`cuda` ones (the policy, engine, loss, trainer-unit and large-N tests)."""

from __future__ import annotations

import pytest

DEVICES = ("cpu", pytest.param("cuda", marks=pytest.mark.gpu))
