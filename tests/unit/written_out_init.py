"""Checks for a @frozen class that writes its own ``__init__`` (a hot class read many times per
hook run): it must take the parameters @frozen would give and make the same value."""

from __future__ import annotations

import inspect
from dataclasses import FrozenInstanceError

import pytest

from nri_numa.frozen import MISSING, fields, frozen


def generic_twin(cls: type) -> type:
    """A subclass of ``cls`` with its fields and methods but @frozen's own ``__init__``."""
    twin = frozen(type(cls.__name__, (cls,), {"__module__": cls.__module__}))
    assert "__init__" in twin.__dict__ and twin.__init__ is not cls.__init__
    return twin


def values(made: object) -> dict:
    return {f.name: getattr(made, f.name) for f in fields(made)}


def check_written_out_init(cls: type, calls: list[tuple[tuple, dict]]) -> None:
    """``cls.__init__`` has @frozen's signature, and each call makes what @frozen's makes."""
    assert "__init__" in cls.__dict__  # written out, not @frozen's
    twin = generic_twin(cls)
    own = list(inspect.signature(cls.__init__).parameters.values())
    generic = list(inspect.signature(twin.__init__).parameters.values())
    assert [(p.name, p.kind) for p in own] == [(p.name, p.kind) for p in generic]
    for mine, theirs in zip(own, generic):
        assert mine.default is theirs.default or mine.default == theirs.default, mine.name
    # A field filled by a factory has MISSING as its default, as @frozen gives it.
    assert [p.default is MISSING for p in own[1:]] == [
        f.default_factory is not MISSING for f in fields(cls) if f.init]
    for args, kwargs in calls:
        made = cls(*args, **kwargs)
        assert values(made) == values(twin(*args, **kwargs))
        assert [type(v) for v in values(made).values()] == [
            type(v) for v in values(twin(*args, **kwargs)).values()]
        with pytest.raises(FrozenInstanceError):
            setattr(made, fields(cls)[0].name, None)
