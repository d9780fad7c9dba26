"""Fails in the user's own function, two calls deep, as a bad record would make a real script fail."""

from __future__ import annotations

from common import main


def check(label: int) -> None:
    if label > 2:
        raise ValueError(f"label {label} out of range 0..2")


def train_func() -> None:
    for label in (0, 1, 7):
        check(label)


if __name__ == "__main__":
    main(train_func)
