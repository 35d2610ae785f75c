"""Build classes by name ("family backend"), registered by the kernel packages' build
modules when they are imported.

Why a registry: `mono qualify` compiles and `mono bench` lists what is registered, so a
build is checked from the day it is registered, with no second list to keep in step. The
runtime names no model: the caller imports the modules it wants (`load`), and a compile
child imports just the one that registers its build.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable

from .build import Build

_BUILDS: dict[str, type[Build]] = {}


def register(cls: type[Build]) -> type[Build]:
    """Register a Build class under `cls.name()` (a class decorator)."""
    if not (isinstance(cls, type) and issubclass(cls, Build)):
        raise TypeError(f"register: {cls!r} is not a Build class")
    held = _BUILDS.get(cls.name())
    if held is not None and _where(held) != _where(cls):
        raise ValueError(f"two builds named {cls.name()!r}: {_where(held)}, {_where(cls)}")
    _BUILDS[cls.name()] = cls  # a module imported again registers its class again
    return cls


def _where(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def builds(family: str | None = None) -> list[type[Build]]:
    """Registered build classes (of `family`), in registration order."""
    return [c for c in _BUILDS.values() if family is None or c.family == family]


def families() -> list[str]:
    return list(dict.fromkeys(c.family for c in _BUILDS.values()))


def get(name: str) -> type[Build]:
    try:
        return _BUILDS[name]
    except KeyError:
        raise KeyError(f"no build {name!r} registered (known: {', '.join(_BUILDS)})") from None


def load(modules: Iterable[str]) -> dict[str, str]:
    """Import each registration module; {module: why it is absent} for those whose
    package is not installed. Any other import error is a bug and propagates."""
    absent = {}
    for module in modules:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name is None or not (module == exc.name or module.startswith(exc.name + ".")):
                raise
            absent[module] = f"{exc.name} is not installed"
    return absent
