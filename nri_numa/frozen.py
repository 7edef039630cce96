"""``@frozen``: the project's frozen dataclasses, cheap to define.

``@dataclass(frozen=True)`` compiles six methods from generated source for every class, about
1.3 ms a class on the project's 2-CPU VM under Python 3.11, and importing ``dataclasses`` loads
``inspect`` with ``ast``, ``dis`` and ``tokenize`` (~10 ms). A hook run in process defines ~50 such
classes before it does any work. ``@frozen`` makes the same values without either:

* it reads the fields from the class's annotations itself (``field()`` here for the options);
* ``__init__`` has the signature dataclasses would give it but is compiled from nothing: one
  generic function's code with the class's parameter names put in, whose body hands its
  arguments to a loop over the fields (a shorter one where every field is a parameter without
  a factory); a class instantiated 256 times then gets an ``__init__`` compiled for it, from
  one template per shape of fields, as fast as dataclasses' (the agent's hot values; the few
  classes a hook process makes hundreds of at once, such as a machine's CPUs, write their own
  ``__init__`` instead, cheaper than compiling one in every run);
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
    all_fields, all_plain = _collect_fields(cls)
    layout = (_plain_layout if all_plain else _layout)(cls.__name__, all_fields)
    if slots:
        cls = _with_slots(cls, all_fields)
    own = cls.__dict__
    cls.__frozen_fields__ = all_fields
    cls.__frozen_layout__ = layout
    cls.__frozen_repr_names__ = layout.shown
    cls.__dataclass_fields__ = _DataclassFields(cls)
    if "__match_args__" not in own:
        cls.__match_args__ = layout.params
    cls.__setattr__ = _frozen_setattr
    cls.__delattr__ = _frozen_delattr
    if "__init__" not in own:
        cls.__init__ = _generic_init(cls, layout)
    if "__repr__" not in own:
        cls.__repr__ = _repr
    if eq:
        compare_key = cls.__frozen_compare__ = _key(layout.compared)
        cls.__frozen_hash_key__ = (compare_key if layout.hashed == layout.compared
                                   else _key(layout.hashed))
        if "__eq__" not in own:
            cls.__eq__ = _eq
        # A class body that writes __eq__ gets __hash__ = None from Python; dataclasses then
        # still adds its field hash, and so does this. One written by hand is kept.
        if own.get("__hash__", None) is None:
            cls.__hash__ = _hash
    return cls


def _collect_fields(cls: type) -> tuple[tuple[Field, ...], bool]:
    """The bases' fields, then the class's own annotations in order (one that names a base's
    field again replaces it where it stood), as dataclasses orders them; and whether all are
    plain: the class's own, annotated without ``field()``."""
    found: dict[str, Field] = {}
    for base in reversed(cls.__mro__[1:]):
        for f in base.__dict__.get("__frozen_fields__", ()):
            found[f.name] = f
    all_plain = not found
    own = cls.__dict__
    annotations = own.get("__annotations__", {})
    for name, annotation in annotations.items():
        text = annotation if isinstance(annotation, str) else repr(annotation)
        # Only a text that holds one of the names can be one of them: most are not looked at.
        if "Var" in text or "KW_ONLY" in text:
            kind = _annotation_kind(text)
            if kind == "ClassVar":
                continue
            if kind in ("InitVar", "KW_ONLY"):
                raise TypeError(f"{cls.__name__}.{name}: @frozen has no {kind} fields")
        value = own.get(name, MISSING)
        if value is MISSING:
            found[name] = _plain_field(name, annotation, MISSING)
        elif isinstance(value, Field):
            all_plain = False
            found[name] = value.named(name, annotation)
            # the class keeps a plain default, as with dataclasses
            if value.default is MISSING:
                delattr(cls, name)
            else:
                setattr(cls, name, value.default)
        elif type(value).__name__ == "Field" and type(value).__module__ == "dataclasses":
            raise TypeError(f"{cls.__name__}.{name}: a dataclasses.field; @frozen reads "
                            "nri_numa.frozen.field")
        elif type(value).__hash__ is None:
            raise ValueError(f"mutable default {type(value)} for field {name} is not "
                             "allowed: use default_factory")
        else:
            found[name] = _plain_field(name, annotation, value)
    for name, value in own.items():
        if isinstance(value, Field) and name not in annotations:
            raise TypeError(f"{cls.__name__}.{name} is a field but has no type annotation")
    return tuple(found.values()), all_plain


def _plain_field(name: str, annotation: Any, default: Any) -> Field:
    """The field of an annotation without ``field()``: a parameter, with or without default.
    Its slots are set here, without Field.__init__ (half the time; its one check, a default
    and a factory both given, cannot fail)."""
    made = _new_object(Field)
    made.name, made.type, made.default, made.default_factory = name, annotation, default, MISSING
    made.init = made.repr = made.compare = True
    made.hash = None
    return made


_new_object = object.__new__


def _annotation_kind(text: str) -> str:
    """ClassVar, InitVar, KW_ONLY or "" for an annotation's text: the annotation itself if a
    string (postponed evaluation), else its repr."""
    return text.partition("[")[0].rpartition(".")[2].strip()


class _Layout:
    """What the fields are for: the names repr shows, __init__'s parameters and defaults, the
    names eq and hash read, and what the generic __init__ sets (``steps``; None where every
    field is a parameter without a factory, set as given). The generic __init__ also counts
    its calls here."""

    __slots__ = ("shown", "params", "defaults", "compared", "hashed", "steps", "cls", "init",
                 "post_init", "calls")

    def __init__(self, shown: tuple[str, ...], params: tuple[str, ...],
                 defaults: tuple[Any, ...] | None, compared: tuple[str, ...],
                 hashed: tuple[str, ...], steps: tuple[tuple[str, int, Any], ...] | None) -> None:
        self.shown, self.params, self.defaults = shown, params, defaults
        self.compared, self.hashed, self.steps = compared, hashed, steps
        self.cls: Any = None  # the class and its generic __init__, once made
        self.init: Any = None
        self.post_init = False
        self.calls = 0


def _layout(class_name: str, all_fields: tuple[Field, ...]) -> _Layout:
    """The fields' layout, in one pass over them (which also refuses a field without a default
    after one with a default)."""
    shown, params, defaults, compared, hashed, steps = [], [], [], [], [], []
    only_params = True
    with_default = None
    for f in all_fields:
        name = f.name
        if f.repr:
            shown.append(name)
        if f.compare:
            compared.append(name)
        if f.compare if f.hash is None else f.hash:
            hashed.append(name)
        if f.init:
            params.append(name)
            if f.default_factory is not MISSING:
                defaults.append(MISSING)  # the generic __init__ calls the factory
                steps.append((name, _FACTORY_PARAM, f.default_factory))
                only_params = False
                with_default = name
                continue
            if f.default is not MISSING:
                defaults.append(f.default)
                with_default = name
            elif with_default is not None:
                raise _order_error(class_name, name, with_default)
            steps.append((name, _PARAM, None))
        else:
            only_params = False
            if f.default_factory is not MISSING:
                steps.append((name, _FACTORY, f.default_factory))
            elif f.default is not MISSING:
                steps.append((name, _DEFAULT, f.default))
            # else nothing to set: __post_init__ does
    return _Layout(tuple(shown), tuple(params), tuple(defaults) or None, tuple(compared),
                   tuple(hashed), None if only_params else tuple(steps))


def _plain_layout(class_name: str, all_fields: tuple[Field, ...]) -> _Layout:
    """``_layout`` of plain fields (``_plain_field``), with less to look at: every one is a
    parameter, shown, compared and hashed."""
    names = tuple(f.name for f in all_fields)
    defaults = []
    with_default = None
    for f in all_fields:
        if f.default is not MISSING:
            defaults.append(f.default)
            with_default = f.name
        elif with_default is not None:
            raise _order_error(class_name, f.name, with_default)
    return _Layout(names, names, tuple(defaults) or None, names, names, None)


def _order_error(class_name: str, name: str, with_default: str) -> TypeError:
    return TypeError(f"{class_name}: non-default argument {name!r} follows default argument "
                     f"{with_default!r}")


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
    return _NO_KEY


_NO_KEY = staticmethod(lambda obj: ())


# Each field's part in __init__: a parameter, a parameter whose default is a factory's call,
# or no parameter (init=False) with a factory, a default, or nothing (__post_init__ sets it).
_PARAM, _FACTORY_PARAM, _FACTORY, _DEFAULT, _NOTHING = range(5)
# The code of __init__ for each shape of fields, compiled once per process: a class's own is
# the same code with its field names and defaults put in (CodeType.replace), which costs
# ~10 us against ~300 us for compiling its source.
_TEMPLATES: dict[tuple[tuple[int, ...], bool], Any] = {}
# A compiled __init__ saves ~1 us a call and costs ~300 us for a new shape of fields, so it
# pays only past a few hundred calls: a class made fewer times keeps the generic one, as every
# class does in a hook process (~150 of the most made one with 40 containers placed).
_COMPILE_AFTER = 256
_object_setattr = object.__setattr__


def _fill(layout: _Layout, self: Any, given: dict[str, Any]) -> None:
    """The generic __init__'s body: ``given`` is its arguments (its locals)."""
    for name, part, extra in layout.steps:
        if part == _PARAM:
            value = given[name]
        elif part == _FACTORY_PARAM:
            value = given[name]
            if value is MISSING:
                value = extra()
        elif part == _FACTORY:
            value = extra()
        else:
            value = extra
        _object_setattr(self, name, value)
    layout.calls += 1
    if layout.calls == _COMPILE_AFTER:
        _compile_if_generic(layout)
    if layout.post_init:
        self.__post_init__()


def _fill_params(layout: _Layout, self: Any, given: dict[str, Any]) -> None:
    """``_fill`` of a class whose fields are all parameters without a factory: each is set as
    given, in a shorter loop."""
    for name in layout.params:
        _object_setattr(self, name, given[name])
    layout.calls += 1
    if layout.calls == _COMPILE_AFTER:
        _compile_if_generic(layout)
    if layout.post_init:
        self.__post_init__()


def _compile_if_generic(layout: _Layout) -> None:
    """The class's compiled __init__ in place of its generic one, unless it has another now."""
    if layout.cls.__dict__.get("__init__") is layout.init:
        layout.cls.__init__ = _compile_init(layout.cls)


# What every generated __init__ sees as its globals (a compiled one with factories, a copy
# with them added); a generic one whose fields are all parameters without a factory
# (``_Layout.steps`` None) calls _fill_params by the same name.
_GLOBALS = {_SETATTR: _object_setattr, _NO_VALUE: MISSING, "__frozen_fill__": _fill,
            "__builtins__": builtins}
_PARAMS_GLOBALS = {**_GLOBALS, "__frozen_fill__": _fill_params}
__frozen_fill__ = _fill  # the name the generic code calls, here too so that it reads as defined


def _generic_code(self: Any) -> None:
    # Its code is every generic __init__'s, with the class's parameters and layout put in and
    # _GLOBALS or _PARAMS_GLOBALS as its globals; written here, it comes compiled with the
    # module.
    __frozen_fill__("\x00layout", self, locals())


_GENERIC_CODE = _generic_code.__code__
_LAYOUT_AT = _GENERIC_CODE.co_consts.index("\x00layout")


def _generic_init(cls: type, layout: _Layout) -> Callable[..., None]:
    """``__init__`` with the signature dataclasses would give, whose body hands its arguments
    to ``_fill`` or ``_fill_params``: made without compiling anything (the code of one
    function, with the class's parameter names and layout put in). A class instantiated
    ``_COMPILE_AFTER`` times then gets the compiled one, a few times faster per call."""
    layout.cls, layout.post_init = cls, hasattr(cls, "__post_init__")
    names = layout.params
    consts = list(_GENERIC_CODE.co_consts)
    consts[_LAYOUT_AT] = layout
    code = _GENERIC_CODE.replace(co_argcount=len(names) + 1, co_nlocals=len(names) + 1,
                                 co_varnames=("self", *names), co_consts=tuple(consts),
                                 co_qualname=f"{cls.__qualname__}.__init__")
    init = layout.init = FunctionType(code, _PARAMS_GLOBALS if layout.steps is None else _GLOBALS,
                                      "__init__", layout.defaults)
    init.__module__ = cls.__module__
    return init


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
                 _FACTORY_PARAM: f"{_factory_name(i)}() if p{i} is {_NO_VALUE} else p{i}",
                 _FACTORY: f"{_factory_name(i)}()",
                 _DEFAULT: _placeholder("default", i)}.get(part)
        if value is not None:
            body.append(f"    {_SETATTR}(self, {_placeholder('name', i)}, {value})")
    if post_init:
        body.append("    self.__post_init__()")
    source = f"def __init__(self{''.join(params)}):\n" + "\n".join(body or ["    pass"]) + "\n"
    namespace: dict[str, Any] = {}
    exec(source, _GLOBALS, namespace)  # noqa: S102 - source built above, no user text
    code = _TEMPLATES[(shape, post_init)] = namespace["__init__"].__code__
    return code


def _placeholder(what: str, index: int) -> str:
    """A string constant in a template, replaced in each class's code by what it stands for;
    a string literal there, so a default is loaded as a constant."""
    return repr(f"\x00{what}{index}")


def _factory_name(index: int) -> str:
    """The global name a template calls a factory by: a constant called there would be
    compiled with a SyntaxWarning, so each class's function has its factories in its
    globals."""
    return f"__frozen_factory{index}__"


def _compile_init(cls: type) -> Callable[..., None]:
    """``__init__`` as dataclasses writes it for a frozen class: the template of the class's
    shape of fields with its names and defaults put in, its factories in its globals."""
    all_fields = cls.__frozen_fields__
    template = _template(tuple(_part(f) for f in all_fields), hasattr(cls, "__post_init__"))
    stands_for: dict[str, Any] = {}
    factories: dict[str, Any] = {}
    for i, f in enumerate(all_fields):
        stands_for[f"\x00name{i}"] = f.name
        stands_for[f"\x00default{i}"] = f.default
        if f.default_factory is not MISSING:
            factories[_factory_name(i)] = f.default_factory
    layout = cls.__frozen_layout__
    names = layout.params
    consts = tuple(stands_for.get(c, c) if type(c) is str else c for c in template.co_consts)
    code = template.replace(co_varnames=("self", *names, *template.co_varnames[len(names) + 1:]),
                            co_consts=consts, co_qualname=f"{cls.__qualname__}.__init__")
    init = FunctionType(code, {**_GLOBALS, **factories} if factories else _GLOBALS, "__init__",
                        layout.defaults)
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
