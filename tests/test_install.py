"""The package's metadata installs without setuptools' deprecation warnings (the license as an SPDX
expression, not the TOML table setuptools stops reading on 2027-02-18)."""

from __future__ import annotations

import importlib.metadata
import tomllib
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_the_installed_package_carries_its_license_as_an_spdx_expression():
    """What pip's isolated build (setuptools >= 77, pyproject's build-system) wrote for this
    install: a ``License-Expression`` (metadata 2.4), which only the SPDX form gives; the old
    ``license = {text = ...}`` table wrote a ``License`` field and a deprecation warning."""
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert meta["project"]["license"] == "Apache-2.0"
    assert "setuptools>=77" in meta["build-system"]["requires"]  # the first to read an SPDX license
    md = importlib.metadata.metadata("llmqueue")
    assert md.get("License-Expression") == "Apache-2.0", dict(md)
    assert md.get("License") is None


def test_pyproject_applies_without_a_deprecation_warning():
    """The configuration read by setuptools itself with warnings as errors. The environment's own
    setuptools may predate the build's (a fresh venv of Python 3.11 ships 65.5, which cannot read
    an SPDX license at all; pip builds with >= 77 in isolation): then the installed metadata above
    is the check."""
    import setuptools

    if int(setuptools.__version__.split(".")[0]) < 77:
        pytest.skip(f"this environment's setuptools {setuptools.__version__} predates SPDX licenses; pip builds "
                    "with >= 77 (the installed metadata's check covers it)")
    from setuptools.config.pyprojecttoml import apply_configuration
    from setuptools.dist import Distribution

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dist = apply_configuration(Distribution(), ROOT / "pyproject.toml")
    assert dist.metadata.license_expression == "Apache-2.0"
