"""The kernels' extension modules, built once per test module: a failed build fails the tests that take them (`make
test` builds the kernels). A test file that means another module by `module` defines its own fixture."""

from __future__ import annotations

import pytest

from kernels import attention as mojo_attention
from kernels import layers as mojo_layers


@pytest.fixture(scope="module")
def module():
    return mojo_attention.load_module()


@pytest.fixture(scope="module")
def layers_module():
    return mojo_layers.load()
