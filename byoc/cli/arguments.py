"""Argument types the commands share: numbers checked when the command line is read, so that a
count of 0 or a negative budget is a usage error naming the option, not a failure deep in a run."""

from __future__ import annotations

import argparse
from collections.abc import Callable


def at_least(least: int) -> Callable[[str], int]:
    """A whole number of at least `least`."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < least:
            raise argparse.ArgumentTypeError(f"must be at least {least}, got {value}")
        return value

    return parse


def non_negative(text: str) -> float:
    """A number of at least 0 (seconds, an error bound)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be at least 0, got {text}")
    return value
