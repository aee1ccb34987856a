"""Shared test setup: the fixtures' manifest, a private compile cache, and the `gpu` marker's skip."""

from __future__ import annotations

import os

import pytest


def pytest_configure(config):
    # One compile cache per test session, so tests never see outputs of an older build.
    if "OPTIML_CACHE_DIR" not in os.environ:
        import tempfile

        os.environ["OPTIML_CACHE_DIR"] = tempfile.mkdtemp(prefix="optiml-test-cache-")


def pytest_collection_modifyitems(config, items):
    from optiml.harness.gpu import local_gpus

    if local_gpus():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU; NVML finds none on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
