"""Fresh random inputs every run: the base seed is printed in the header and in every failing test's
output. Re-run with FLASHTILE_TEST_SEED=<seed> to reproduce."""

import os
import zlib

import numpy as np
import pytest

SEED = int(os.environ.get("FLASHTILE_TEST_SEED", np.random.SeedSequence().entropy % (2**32)))


def pytest_report_header(config):
    return f"flashtile tests: FLASHTILE_TEST_SEED={SEED}"


@pytest.fixture
def rng(request):
    # One stream per test, derived from the base seed and the test's id, so that a failing test can be
    # re-run alone with the same inputs.
    seed = [SEED, zlib.crc32(request.node.nodeid.encode())]
    print(f"FLASHTILE_TEST_SEED={SEED} (test stream {seed})")
    return np.random.default_rng(seed)
