"""``@frozen``: the project's frozen dataclasses, cheap to define.

``@dataclass(frozen=True)`` compiles six methods from generated source for every class, about
1.3 ms a class on the project's 2-CPU VM under Python 3.11, and importing ``dataclasses`` loads
``inspect`` with ``ast``, ``dis`` and ``tokenize`` (~10 ms). A hook run in process defines 64 such
classes before it does any work. ``@frozen`` makes the same values without either:

* it reads the fields from the class's annotations itself (``field()`` here for the options);
* ``__init__`` is compiled on the class's first instantiation, from the source dataclasses
  would write, so an instance costs what it did, and a class never instantiated costs nothing;
* ``__repr__``, ``__eq__``, ``__hash__``, ``__setattr__`` and ``__delattr__`` are functions
  shared by all classes, reading each class's field names;
* ``fields`` and ``replace`` here work on its classes (and on any dataclass); the
  ``dataclasses`` module's own functions (``fields``, ``replace``, ``asdict``, ``is_dataclass``)
  still work on them: ``__dataclass_fields__`` is built when first asked for, by
  ``dataclasses`` itself on a copy of the fields, so only code that uses it loads it.

What it keeps from ``dataclass(frozen=True)``: positional-or-keyword arguments in field order,
fields inherited from ``@frozen`` bases, defaults (an unhashable one refused, as there),
``field(default_factory=...)``, ``field(init=False)`` (set in ``__post_init__`` with
``object.__setattr__``), ``compare``/``hash``/``repr`` per field, ``ClassVar`` annotations left
out, ``__post_init__``, ``__match_args__``, methods a class writes itself kept,
``dataclasses.FrozenInstanceError`` on assignment, equality only between instances of the same class,
``slots=True``. What it refuses at definition, so that nothing silently behaves otherwise:
``InitVar`` and keyword-only fields, a field without a default after one with a default, a
``dataclasses.field`` (this module's ``field`` is the one it reads).
"""

from __future__ import annotations

from collections.abc import Callable
from operator import attrgetter
from typing import Any, TypeVar, dataclass_transform

__all__ = ["MISSING", "Field", "field", "fields", "frozen", "replace"]

T = TypeVar("T", bound=type)


class _Missing:
    """No default given (and, as a parameter's default, a factory to call)."""

    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()
_SETATTR = "__frozen_setattr__"  # the name object.__setattr__ has in each generated __init__
_NO_VALUE = "__frozen_missing__"


class Field:
    """One field of a ``@frozen`` class: ``dataclasses.Field``'s public attributes."""

    __slots__ = ("name", "type", "default", "default_factory", "init", "repr", "compare",
                 "hash")

    def __init__(self, default: Any, default_factory: Any, init: bool, repr: bool,
                 compare: bool, hash: bool | None) -> None:
        if default is not MISSING and default_factory is not MISSING:
            raise ValueError("cannot specify both default and default_factory")
        self.name: str = ""
        self.type: Any = None
        self.default, self.default_factory = default, default_factory
        self.init, self.repr, self.compare, self.hash = init, repr, compare, hash

    def __repr__(self) -> str:
        return (f"Field(name={self.name!r}, type={self.type!r}, default={self.default!r}, "
                f"default_factory={self.default_factory!r}, init={self.init}, "
                f"repr={self.repr}, compare={self.compare}, hash={self.hash})")

    @property
    def has_default(self) -> bool:
        return self.default is not MISSING or self.default_factory is not MISSING

    def named(self, name: str, annotation: Any) -> Field:
        """This field's options under a name (a base's field stays as the base has it)."""
        copy = Field(self.default, self.default_factory, self.init, self.repr, self.compare,
                     self.hash)
        copy.name, copy.type = name, annotation
        return copy


def field(*, default: Any = MISSING, default_factory: Any = MISSING, init: bool = True,
          repr: bool = True, compare: bool = True, hash: bool | None = None) -> Any:
    """A field's options, as ``dataclasses.field`` takes them (no keyword-only fields)."""
    return Field(default, default_factory, init, repr, compare, hash)


def fields(class_or_instance: Any) -> tuple[Field, ...]:
    """The fields of a ``@frozen`` class or value (of any dataclass, through ``dataclasses``)."""
    try:
        return class_or_instance.__frozen_fields__
    except AttributeError:
        import dataclasses

        return dataclasses.fields(class_or_instance)


def replace(obj: Any, /, **changes: Any) -> Any:
    """A copy of ``obj`` with ``changes``, as ``dataclasses.replace``."""
    try:
        own = obj.__frozen_fields__
    except AttributeError:
        import dataclasses

        return dataclasses.replace(obj, **changes)
    for f in own:
        if not f.init:
            if f.name in changes:
                raise ValueError(f"field {f.name} is declared with init=False, it cannot be "
                                 "specified with replace()")
        elif f.name not in changes:
            changes[f.name] = getattr(obj, f.name)
    return obj.__class__(**changes)


@dataclass_transform(frozen_default=True, field_specifiers=(field, Field))
def frozen(cls: T | None = None, /, *, eq: bool = True,
           slots: bool = False) -> T | Callable[[T], T]:
    """The class as a frozen dataclass; ``eq=False`` keeps identity equality and hashing;
    ``slots=True`` makes a new class with ``__slots__`` for the fields, as dataclasses does
    (lighter instances; a method that calls ``super()`` without arguments cannot be in it)."""

    def wrap(cls: T) -> T:
        return _make_frozen(cls, eq, slots)

    return wrap if cls is None else wrap(cls)


def _make_frozen(cls: T, eq: bool, slots: bool) -> T:
    for name in ("__setattr__", "__delattr__"):
        if name in cls.__dict__:
            raise TypeError(f"cannot overwrite attribute {name} in class {cls.__name__}")
    all_fields = _collect_fields(cls)
    if slots:
        cls = _with_slots(cls, all_fields)
    own = cls.__dict__
    cls.__frozen_fields__ = all_fields
    cls.__frozen_repr_names__ = tuple(f.name for f in all_fields if f.repr)
    cls.__dataclass_fields__ = _DataclassFields(cls)
    if "__match_args__" not in own:
        cls.__match_args__ = tuple(f.name for f in all_fields if f.init)
    cls.__setattr__ = _frozen_setattr
    cls.__delattr__ = _frozen_delattr
    if "__init__" not in own:
        cls.__init__ = _first_init(cls)
    if "__repr__" not in own:
        cls.__repr__ = _repr
    if eq:
        compared = tuple(f.name for f in all_fields if f.compare)
        hashed = tuple(f.name for f in all_fields if (f.compare if f.hash is None else f.hash))
        cls.__frozen_compare__ = _key(compared)
        cls.__frozen_hash_key__ = _key(hashed)
        if "__eq__" not in own:
            cls.__eq__ = _eq
        # A class body that writes __eq__ gets __hash__ = None from Python; dataclasses then
        # still adds its field hash, and so does this. One written by hand is kept.
        if own.get("__hash__", None) is None:
            cls.__hash__ = _hash
    return cls


def _collect_fields(cls: type) -> tuple[Field, ...]:
    """The bases' fields, then the class's own annotations in order (one that names a base's
    field again replaces it where it stood), as dataclasses orders them."""
    found: dict[str, Field] = {}
    for base in reversed(cls.__mro__[1:]):
        for f in base.__dict__.get("__frozen_fields__", ()):
            found[f.name] = f
    own = cls.__dict__
    annotations = own.get("__annotations__", {})
    for name, annotation in annotations.items():
        kind = _annotation_kind(annotation)
        if kind == "ClassVar":
            continue
        if kind in ("InitVar", "KW_ONLY"):
            raise TypeError(f"{cls.__name__}.{name}: @frozen has no {kind} fields")
        value = own.get(name, MISSING)
        if isinstance(value, Field):
            spec = value
        elif type(value).__name__ == "Field" and type(value).__module__ == "dataclasses":
            raise TypeError(f"{cls.__name__}.{name}: a dataclasses.field; @frozen reads "
                            "nri_numa.frozen.field")
        else:
            if value is not MISSING and type(value).__hash__ is None:
                raise ValueError(f"mutable default {type(value)} for field {name} is not "
                                 "allowed: use default_factory")
            spec = Field(value, MISSING, True, True, True, None)
        found[name] = spec.named(name, annotation)
        if isinstance(value, Field):  # the class keeps a plain default, as with dataclasses
            if value.default is MISSING:
                delattr(cls, name)
            else:
                setattr(cls, name, value.default)
    for name, value in own.items():
        if isinstance(value, Field) and name not in annotations:
            raise TypeError(f"{cls.__name__}.{name} is a field but has no type annotation")
    result = tuple(found.values())
    _check_order(cls, result)
    return result


def _annotation_kind(annotation: Any) -> str:
    """ClassVar, InitVar, KW_ONLY or "" for an annotation, whether a string (postponed
    evaluation) or an object."""
    text = annotation if isinstance(annotation, str) else repr(annotation)
    return text.partition("[")[0].rpartition(".")[2].strip()


def _check_order(cls: type, all_fields: tuple[Field, ...]) -> None:
    with_default = None
    for f in all_fields:
        if not f.init:
            continue
        if f.has_default:
            with_default = f.name
        elif with_default is not None:
            raise TypeError(f"{cls.__name__}: non-default argument {f.name!r} follows default "
                            f"argument {with_default!r}")


def _with_slots(cls: T, all_fields: tuple[Field, ...]) -> T:
    inherited = {name for base in cls.__mro__[1:] for name in base.__dict__.get("__slots__", ())}
    names = [f.name for f in all_fields]
    body = {key: value for key, value in cls.__dict__.items()
            if key not in names and key not in ("__dict__", "__weakref__")}
    body["__slots__"] = tuple(name for name in names if name not in inherited)
    body["__getstate__"] = _slots_getstate  # pickle and copy would set slots by __setattr__
    body["__setstate__"] = _slots_setstate
    new = type(cls)(cls.__name__, cls.__bases__, body)
    new.__qualname__ = cls.__qualname__
    return new


def _slots_getstate(self: Any) -> list[Any]:
    return [getattr(self, f.name) for f in self.__frozen_fields__]


def _slots_setstate(self: Any, state: list[Any]) -> None:
    for f, value in zip(self.__frozen_fields__, state):
        object.__setattr__(self, f.name, value)


class _DataclassFields:
    """A class's ``__dataclass_fields__``, made by the ``dataclasses`` module on first use from
    a copy of the class's fields (dataclasses' functions need its own Field objects)."""

    def __init__(self, cls: type) -> None:
        self._cls = cls
        self._fields: dict[str, Any] | None = None

    def __get__(self, obj: Any, owner: type | None = None) -> dict[str, Any]:
        if self._fields is None:
            import dataclasses

            namespace: dict[str, Any] = {"__annotations__": {}}
            for f in self._cls.__frozen_fields__:
                namespace["__annotations__"][f.name] = f.type
                namespace[f.name] = dataclasses.field(
                    default=dataclasses.MISSING if f.default is MISSING else f.default,
                    default_factory=(dataclasses.MISSING if f.default_factory is MISSING
                                     else f.default_factory),
                    init=f.init, repr=f.repr, compare=f.compare, hash=f.hash)
            copy = dataclasses.dataclass(type(self._cls.__name__, (), namespace),
                                         init=False, repr=False, eq=False)
            self._fields = copy.__dataclass_fields__
        return self._fields


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
    values: dict[str, Any] = {_SETATTR: object.__setattr__, _NO_VALUE: MISSING}
    for f in cls.__frozen_fields__:
        factory = f.default_factory is not MISSING
        if factory:
            values[f"__factory_{f.name}__"] = f.default_factory
        if f.init:
            if factory:
                params.append(f"{f.name}={_NO_VALUE}")
                value = f"__factory_{f.name}__() if {f.name} is {_NO_VALUE} else {f.name}"
            elif f.default is not MISSING:
                values[f"__default_{f.name}__"] = f.default
                params.append(f"{f.name}=__default_{f.name}__")
                value = f.name
            else:
                params.append(f.name)
                value = f.name
        elif factory:
            value = f"__factory_{f.name}__()"
        elif f.default is not MISSING:
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
    from dataclasses import FrozenInstanceError  # a mistake's path: loaded only then

    raise FrozenInstanceError(f"cannot assign to field {name!r}")


def _frozen_delattr(self: Any, name: str) -> None:
    from dataclasses import FrozenInstanceError

    raise FrozenInstanceError(f"cannot delete field {name!r}")


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
