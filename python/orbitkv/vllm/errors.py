"""Errors of the vLLM adapter that need no vLLM import (raised before or without it)."""

from __future__ import annotations


class UnsupportedProfileError(ValueError):
    """The engine configuration is outside OrbitKV's qualified vLLM profile."""
