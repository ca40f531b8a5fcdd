"""Fixtures for the model tests: the HF reference, run once per session."""

from __future__ import annotations

import pytest

from tests.model.tiny import run_reference


@pytest.fixture(scope="session")
def hf_dir(tmp_path_factory):
    """Directory with one sub-directory per tiny family: config.json, model.safetensors and
    the HF logits (fp32 and bf16). Skips when .venv-ref is missing."""
    return run_reference(tmp_path_factory.mktemp("hf_reference"))
