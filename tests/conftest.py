"""Shared pytest setup: the one ``cuda`` marker, no policy memory and an empty drafter cache.

A test marked ``@pytest.mark.cuda`` (or a module with ``pytestmark = pytest.mark.cuda``) runs only
where there is a CUDA device *and* specdec_cuda was built with its CUDA kernels; elsewhere it is
skipped with the reason. This is the only CUDA skip in tests/: do not add ``skipif`` lines of
your own. The marker is registered in pyproject.toml; ``-m cuda`` / ``-m "not cuda"`` select by it.
"""

from __future__ import annotations

import functools
import os
import tempfile

import pytest
import torch

# The cost policy's memory (specdec_cuda.policy_memory) would carry step costs from one test to the
# next and from earlier runs of the suite: tests start from none (test_policy_memory sets its own).
os.environ["SPECDEC_POLICY_CACHE"] = "off"
# Nor the drafter cache (specdec_cuda.drafters): a drafter trained on this machine must not answer
# for a method the test builds without one. Tests that write drafters point it at their own folder.
os.environ["SPECDEC_DRAFTERS_DIR"] = tempfile.mkdtemp(prefix="specdec-drafters-")
os.environ.pop("SPECDEC_DRAFTERS_PATH", None)


@functools.cache
def cuda_skip_reason() -> str | None:
    """Why CUDA tests cannot run here, or None when they can."""
    if not torch.cuda.is_available():
        return "needs a CUDA device"
    import specdec_cuda  # imported late: collection of CPU-only tests must not need the build

    if not specdec_cuda.build_info()["with_cuda"]:
        return "specdec_cuda was built without CUDA kernels (SPECDEC_CUDA=0)"
    return None


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.get_closest_marker("cuda") is None:
            continue
        reason = cuda_skip_reason()
        if reason is not None:
            item.add_marker(pytest.mark.skip(reason=reason))
