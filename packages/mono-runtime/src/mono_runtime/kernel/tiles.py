"""Tile overrides from the environment: a benchmark compares a kernel's tiles without an
edit (each kernel names its variable, e.g. MONO_FFN_TILES="bn=128,uks=2")."""

from __future__ import annotations

import os


def tile_overrides(env: str, tiles: dict[str, int]) -> dict[str, int]:
    """`tiles` with each one that the variable `env` names ("name=int,...") replaced; a
    name the kernel does not have, or a value that is not an int, is refused by name. The
    kernel checks the values it gets."""
    spec = os.environ.get(env, "").strip()
    tiles = dict(tiles)
    for item in filter(None, (x.strip() for x in spec.split(","))):
        name, _, value = item.partition("=")
        if name not in tiles or not value.isdigit():
            raise ValueError(f"{env}={spec!r}: expected name=int items of {sorted(tiles)}")
        tiles[name] = int(value)
    return tiles


def check_tile(
    what: str,
    name: str,
    value: int,
    least: int = 16,
    divides: int | None = None,
    most: int | None = None,
    pow2: bool = True,
) -> None:
    """Refuse by name a tile that is not a power of two (unless `pow2` is False) from
    `least` to `most` dividing `divides` (each check skipped where None): the planners'
    one check of a tile an override may set."""
    bad = (
        value < least
        or (most is not None and value > most)
        or (pow2 and value & (value - 1))
        or (divides is not None and divides % value)
    )
    if bad:
        rules = [f">= {least}"] + [f"<= {most}"] * (most is not None)
        rules += ["a power of two"] * pow2 + [f"dividing {divides}"] * (divides is not None)
        raise ValueError(f"{what} tiles: {name} = {value}: expected {', '.join(rules)}")
