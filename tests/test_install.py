"""The package's metadata installs without setuptools' deprecation warnings (the license as an SPDX
expression, not the TOML table setuptools stops reading on 2027-02-18)."""

from __future__ import annotations

import tomllib
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_pyproject_applies_without_a_deprecation_warning():
    from setuptools.config.pyprojecttoml import apply_configuration
    from setuptools.dist import Distribution

    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert meta["project"]["license"] == "Apache-2.0"
    assert "setuptools>=77" in meta["build-system"]["requires"]  # the first to read an SPDX license
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dist = apply_configuration(Distribution(), ROOT / "pyproject.toml")
    assert dist.metadata.license_expression == "Apache-2.0"
