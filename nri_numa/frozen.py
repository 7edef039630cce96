"""``@frozen``: a frozen dataclass that is cheap to define.

``@dataclass(frozen=True)`` compiles six methods from generated source for every class
(``__init__``, ``__repr__``, ``__eq__``, ``__hash__``, ``__setattr__``, ``__delattr__``): about
1.3 ms a class on the project's 2-CPU VM under Python 3.11, and a hook run in process defines 64
of them before it does anything. ``@frozen`` gives the same values for about a tenth of that:

* ``dataclasses`` still collects the fields (so ``fields``, ``replace``, ``asdict``,
  ``is_dataclass`` and ``__match_args__`` work as on any dataclass), with no method generated;
* ``__init__`` is compiled on the class's first instantiation, from the same kind of source
  dataclasses writes, so an instance costs what it did (a class never instantiated in a run
  costs nothing more);
* ``__repr__``, ``__eq__``, ``__hash__``, ``__setattr__`` and ``__delattr__`` are shared functions
  that read the class's field names, compiled once for all classes.

What it keeps from ``dataclass(frozen=True)``: positional-or-keyword arguments in field order,
defaults, ``field(default_factory=...)``, ``field(init=False)`` (set in ``__post_init__`` with
``object.__setattr__``), ``compare``/``hash``/``repr`` per field, ``__post_init__``, methods a
class writes itself kept, ``FrozenInstanceError`` on assignment, equality only between instances
of the same class. What it refuses at definition, so that nothing silently behaves otherwise:
``InitVar`` and ``kw_only`` fields, and a field without a default after one with a default.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from operator import attrgetter
from typing import Any, TypeVar, dataclass_transform

__all__ = ["frozen"]

T = TypeVar("T", bound=type)

# Names the generated __init__ sees besides its defaults (bound as the defining function's
# arguments, so each class's __init__ reads them as fast locals of a closure).
_SETATTR = "__frozen_setattr__"
_NO_VALUE = "__frozen_no_value__"


class _NoValue:
    """The default of a parameter whose field has a default factory: the factory is called."""

    def __repr__(self) -> str:
        return "<factory>"


NO_VALUE = _NoValue()


@dataclass_transform(frozen_default=True, field_specifiers=(dataclasses.field,
                                                             dataclasses.Field))
def frozen(cls: T | None = None, /, *, eq: bool = True) -> T | Callable[[T], T]:
    """The class as a frozen dataclass; ``eq=False`` keeps identity equality and hashing."""

    def wrap(cls: T) -> T:
        return _make_frozen(cls, eq)

    return wrap if cls is None else wrap(cls)


def _make_frozen(cls: T, eq: bool) -> T:
    own = cls.__dict__
    for name in ("__setattr__", "__delattr__"):
        if name in own:
            raise TypeError(f"cannot overwrite attribute {name} in class {cls.__name__}")
    if cls.__doc__ is None:
        # dataclasses would compute a signature for it, the costliest step it has left.
        cls.__doc__ = cls.__name__
    dataclasses.dataclass(cls, init=False, repr=False, eq=False)
    fields = dataclasses.fields(cls)
    _check_fields(cls, fields)
    cls.__frozen_repr_names__ = tuple(f.name for f in fields if f.repr)
    cls.__setattr__ = _frozen_setattr
    cls.__delattr__ = _frozen_delattr
    if "__init__" not in own:
        cls.__init__ = _first_init(cls)
    if "__repr__" not in own:
        cls.__repr__ = _repr
    if eq:
        compared = tuple(f.name for f in fields if f.compare)
        hashed = tuple(f.name for f in fields if (f.compare if f.hash is None else f.hash))
        cls.__frozen_compare__ = _key(compared)
        cls.__frozen_hash_key__ = _key(hashed)
        if "__eq__" not in own:
            cls.__eq__ = _eq
        # A class body that writes __eq__ gets __hash__ = None from Python; dataclasses then
        # still adds its field hash, and so does this. One written by hand is kept.
        if own.get("__hash__", None) is None:
            cls.__hash__ = _hash
    return cls


def _check_fields(cls: type, fields: tuple[dataclasses.Field, ...]) -> None:
    with_default = None
    for f in fields:
        if f.kw_only is True:
            raise TypeError(f"{cls.__name__}.{f.name}: @frozen has no keyword-only fields")
        if not f.init:
            continue
        if f.default is not dataclasses.MISSING or \
                f.default_factory is not dataclasses.MISSING:
            with_default = f.name
        elif with_default is not None:
            raise TypeError(f"{cls.__name__}: non-default argument {f.name!r} follows default "
                            f"argument {with_default!r}")
    for f in cls.__dataclass_fields__.values():  # fields() leaves InitVars out
        if isinstance(f.type, dataclasses.InitVar) or "InitVar" in str(f.type):
            raise TypeError(f"{cls.__name__}.{f.name}: @frozen has no InitVar fields")


def _key(names: tuple[str, ...]) -> Callable[[Any], tuple]:
    """A C-level getter of the fields as a tuple (attrgetter gives one name's value bare). A
    class attribute: a plain function there would be bound to the instance."""
    if len(names) >= 2:
        return attrgetter(*names)
    if len(names) == 1:
        one = attrgetter(names[0])
        return staticmethod(lambda obj: (one(obj),))
    return staticmethod(lambda obj: ())


def _first_init(cls: type) -> Callable[..., None]:
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        # Only the class that defined it compiles it; a subclass calling super().__init__ too.
        if cls.__dict__.get("__init__") is __init__:
            cls.__init__ = _compile_init(cls)
        cls.__init__(self, *args, **kwargs)

    __init__.__qualname__ = f"{cls.__qualname__}.__init__"
    return __init__


def _compile_init(cls: type) -> Callable[..., None]:
    """``__init__`` as dataclasses writes it for a frozen class, compiled now."""
    params, body = [], []
    values: dict[str, Any] = {_SETATTR: object.__setattr__, _NO_VALUE: NO_VALUE}
    for f in dataclasses.fields(cls):
        factory = f.default_factory is not dataclasses.MISSING
        if factory:
            values[f"__factory_{f.name}__"] = f.default_factory
        if f.init:
            if factory:
                params.append(f"{f.name}={_NO_VALUE}")
                value = (f"__factory_{f.name}__() if {f.name} is {_NO_VALUE} else {f.name}")
            elif f.default is not dataclasses.MISSING:
                values[f"__default_{f.name}__"] = f.default
                params.append(f"{f.name}=__default_{f.name}__")
                value = f.name
            else:
                params.append(f.name)
                value = f.name
        elif factory:
            value = f"__factory_{f.name}__()"
        elif f.default is not dataclasses.MISSING:
            values[f"__default_{f.name}__"] = f.default
            value = f"__default_{f.name}__"
        else:
            continue  # set by __post_init__
        body.append(f"  {_SETATTR}(self, {f.name!r}, {value})")
    if hasattr(cls, "__post_init__"):
        body.append("  self.__post_init__()")
    source = (f"def __make__({', '.join(values)}):\n"
              f" def __init__(self{''.join(', ' + p for p in params)}):\n"
              + "\n".join(body or ["  pass"]) + "\n return __init__\n")
    namespace: dict[str, Any] = {}
    exec(source, {}, namespace)  # noqa: S102 - source built above from field names only
    init = namespace["__make__"](*values.values())
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__module__ = cls.__module__
    return init


def _frozen_setattr(self: Any, name: str, value: Any) -> None:
    raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")


def _frozen_delattr(self: Any, name: str) -> None:
    raise dataclasses.FrozenInstanceError(f"cannot delete field {name!r}")


def _repr(self: Any) -> str:
    shown = ", ".join(f"{name}={getattr(self, name)!r}"
                      for name in type(self).__frozen_repr_names__)
    return f"{type(self).__qualname__}({shown})"


def _eq(self: Any, other: Any) -> bool:
    if other.__class__ is not self.__class__:
        return NotImplemented
    key = self.__frozen_compare__
    return key(self) == key(other)


def _hash(self: Any) -> int:
    return hash(self.__frozen_hash_key__(self))
