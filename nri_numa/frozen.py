"""``@frozen``: the project's frozen dataclasses, cheap to define.

``@dataclass(frozen=True)`` compiles six methods from generated source for every class, about
1.3 ms a class on the project's 2-CPU VM under Python 3.11, and importing ``dataclasses`` loads
``inspect`` with ``ast``, ``dis`` and ``tokenize`` (~10 ms). A hook run in process defines 64 such
classes before it does any work. ``@frozen`` makes the same values without either:

* it reads the fields from the class's annotations itself (``field()`` here for the options);
* ``__init__`` has the signature dataclasses would give it but is compiled from nothing: one
  generic function's code with the class's parameter names put in, whose body hands its
  arguments to a loop over the fields; a class instantiated 64 times then gets an ``__init__``
  compiled for it, from one template per shape of fields, as fast as dataclasses' (the agent's
  hot values; the few classes a hook process makes hundreds of at once, such as a machine's
  CPUs, write their own ``__init__`` instead, cheaper than compiling one in every run);
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
``dataclasses.FrozenInstanceError`` on assignment, equality only between instances of the same
class, ``slots=True``. What it refuses at definition, so that nothing silently behaves otherwise:
``InitVar`` and keyword-only fields, a field without a default after one with a default, a
``dataclasses.field`` (this module's ``field`` is the one it reads).
"""

from __future__ import annotations

import builtins
from collections.abc import Callable
from operator import attrgetter
from types import FunctionType

__all__ = ["MISSING", "Field", "field", "fields", "frozen", "replace"]

TYPE_CHECKING = False  # as typing.TYPE_CHECKING: a hook process does not import typing
if TYPE_CHECKING:
    from typing import Any, TypeVar, dataclass_transform

    T = TypeVar("T", bound=type)
else:
    def dataclass_transform(**_: object) -> Callable[[T], T]:
        return lambda decorated: decorated  # it only speaks to type checkers


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
        cls.__init__ = _generic_init(cls)
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


# Each field's part in __init__: a parameter, a parameter whose default is a factory's call,
# or no parameter (init=False) with a factory, a default, or nothing (__post_init__ sets it).
_PARAM, _FACTORY_PARAM, _FACTORY, _DEFAULT, _NOTHING = range(5)
# The code of __init__ for each shape of fields, compiled once per process: a class's own is
# the same code with its field names, factories and defaults put in (CodeType.replace), which
# costs ~10 us against ~250 us for compiling its source.
_TEMPLATES: dict[tuple[tuple[int, ...], bool], Any] = {}
_COMPILE_AFTER = 64


class _InitPlan:
    """What a class's generic __init__ sets, and how many times it ran."""

    __slots__ = ("cls", "steps", "post_init", "calls", "init")

    def __init__(self, cls: type) -> None:
        self.cls = cls
        self.init: Any = None  # the generic __init__ it belongs to
        self.steps = tuple((f.name, _part(f), f.default if f.default_factory is MISSING
                            else f.default_factory) for f in cls.__frozen_fields__)
        self.post_init = hasattr(cls, "__post_init__")
        self.calls = 0


def _fill(plan: _InitPlan, self: Any, given: dict[str, Any]) -> None:
    """The generic __init__'s body: ``given`` is its arguments (its locals)."""
    for name, part, extra in plan.steps:
        if part == _PARAM:
            value = given[name]
        elif part == _FACTORY_PARAM:
            value = given[name]
            if value is MISSING:
                value = extra()
        elif part == _FACTORY:
            value = extra()
        elif part == _DEFAULT:
            value = extra
        else:
            continue
        object.__setattr__(self, name, value)
    plan.calls += 1
    if plan.calls == _COMPILE_AFTER and plan.cls.__dict__.get("__init__") is plan.init:
        plan.cls.__init__ = _compile_init(plan.cls)
    if plan.post_init:
        self.__post_init__()


# What every generated __init__ sees as its globals.
_GLOBALS = {_SETATTR: object.__setattr__, _NO_VALUE: MISSING, "__frozen_fill__": _fill,
            "__builtins__": builtins}
__frozen_fill__ = _fill  # the name the generic code calls, here too so that it reads as defined


def _generic_code(self: Any) -> None:
    # Its code is every generic __init__'s, with the class's parameters and plan put in and
    # _GLOBALS as its globals; written here, it comes compiled with the module.
    __frozen_fill__("\x00plan", self, locals())


_GENERIC_CODE = _generic_code.__code__


def _generic_init(cls: type) -> Callable[..., None]:
    """``__init__`` with the signature dataclasses would give, whose body hands its arguments
    to ``_fill``: made without compiling anything (the code of one function, with the class's
    parameter names and plan put in). A class instantiated ``_COMPILE_AFTER`` times then gets
    the compiled one, a few times faster per call."""
    plan = _InitPlan(cls)
    names, defaults = _parameters(cls)
    consts = tuple(plan if c == "\x00plan" else c for c in _GENERIC_CODE.co_consts)
    code = _GENERIC_CODE.replace(co_argcount=len(names) + 1, co_nlocals=len(names) + 1,
                                 co_varnames=("self", *names), co_consts=consts,
                                 co_qualname=f"{cls.__qualname__}.__init__")
    init = plan.init = FunctionType(code, _GLOBALS, "__init__", defaults)
    init.__module__ = cls.__module__
    return init


def _parameters(cls: type) -> tuple[list[str], tuple[Any, ...] | None]:
    """__init__'s parameter names and defaults (MISSING where a factory is called)."""
    names, defaults = [], []
    for f in cls.__frozen_fields__:
        if f.init:
            names.append(f.name)
            if f.default is not MISSING:
                defaults.append(f.default)
            elif f.default_factory is not MISSING:
                defaults.append(MISSING)
    return names, tuple(defaults) or None


def _part(f: Field) -> int:
    if f.init:
        return _PARAM if f.default_factory is MISSING else _FACTORY_PARAM
    if f.default_factory is not MISSING:
        return _FACTORY
    return _NOTHING if f.default is MISSING else _DEFAULT


def _template(shape: tuple[int, ...], post_init: bool) -> Any:
    code = _TEMPLATES.get((shape, post_init))
    if code is not None:
        return code
    params, body = [], []
    for i, part in enumerate(shape):
        if part in (_PARAM, _FACTORY_PARAM):  # defaults come with each class's function
            params.append(f", p{i}")
        value = {_PARAM: f"p{i}",
                 _FACTORY_PARAM: f"{_placeholder('factory', i)}() if p{i} is {_NO_VALUE} "
                                 f"else p{i}",
                 _FACTORY: f"{_placeholder('factory', i)}()",
                 _DEFAULT: _placeholder("default", i)}.get(part)
        if value is not None:
            body.append(f"    {_SETATTR}(self, {_placeholder('name', i)}, {value})")
    if post_init:
        body.append("    self.__post_init__()")
    source = f"def __init__(self{''.join(params)}):\n" + "\n".join(body or ["    pass"]) + "\n"
    namespace: dict[str, Any] = {}
    import warnings  # here: a process that compiles no __init__ never loads it

    with warnings.catch_warnings():  # "'str' object is not callable": a factory's placeholder
        warnings.simplefilter("ignore", SyntaxWarning)
        exec(source, _GLOBALS, namespace)  # noqa: S102 - source built above, no user text
    code = _TEMPLATES[(shape, post_init)] = namespace["__init__"].__code__
    return code


def _placeholder(what: str, index: int) -> str:
    """A string constant in a template, replaced in each class's code by what it stands for;
    a string literal there, so a factory or a default is loaded as a constant."""
    return repr(f"\x00{what}{index}")


def _compile_init(cls: type) -> Callable[..., None]:
    """``__init__`` as dataclasses writes it for a frozen class: the template of the class's
    shape of fields with its names, factories and defaults put in."""
    all_fields = cls.__frozen_fields__
    template = _template(tuple(_part(f) for f in all_fields), hasattr(cls, "__post_init__"))
    stands_for: dict[str, Any] = {}
    for i, f in enumerate(all_fields):
        stands_for[f"\x00name{i}"] = f.name
        stands_for[f"\x00factory{i}"] = f.default_factory
        stands_for[f"\x00default{i}"] = f.default
    names, defaults = _parameters(cls)
    consts = tuple(stands_for.get(c, c) if type(c) is str else c for c in template.co_consts)
    code = template.replace(co_varnames=("self", *names, *template.co_varnames[len(names) + 1:]),
                            co_consts=consts, co_qualname=f"{cls.__qualname__}.__init__")
    init = FunctionType(code, _GLOBALS, "__init__", defaults)
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
