"""Embedded model zoo: models built from configs with seeded random weights, no downloads."""

from .zoo import ModelSpec, build, get_spec, list_models

__all__ = ["ModelSpec", "build", "get_spec", "list_models"]
