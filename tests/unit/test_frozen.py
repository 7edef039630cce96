"""``@frozen`` against ``@dataclass(frozen=True)``: the same class written both ways must behave
alike wherever the project relies on it."""

from __future__ import annotations

import copy
import dataclasses
import pickle
from dataclasses import FrozenInstanceError

import pytest

from nri_numa import frozen as frozen_module
from nri_numa.frozen import field, frozen


@pytest.fixture(params=["generic", "compiled"])
def phase(request):
    """Each class's __init__ as it starts (generic) and as it is once compiled."""
    return request.param


def both(make, phase="generic"):
    """The class ``make(decorator, field)`` builds, once with each decorator and its field."""
    ours = make(frozen, field)
    if phase == "compiled":
        ours.__init__ = frozen_module._compile_init(ours)
    return ours, make(dataclasses.dataclass(frozen=True), dataclasses.field)


def _point(decorate, field):
    @decorate
    class Point:
        x: int
        y: int = 2
        tags: tuple[str, ...] = ()
        seen: list[int] = field(default_factory=list, compare=False)
        label: str = field(default="p", repr=False)
        cached: int = field(init=False, repr=False, compare=False)

        def __post_init__(self) -> None:
            object.__setattr__(self, "cached", self.x * 10)

    return Point


def _single(decorate, field):
    @decorate
    class Single:
        value: float

    return Single


def _empty(decorate, field):
    @decorate
    class Empty:
        pass

    return Empty


@pytest.mark.parametrize("args, kwargs", [((1,), {}), ((1, 5), {}), ((), {"x": 3, "tags": ("a",)}),
                                          ((4, 5, ("t",), [1], "q"), {})])
def test_instances_equal_to_the_dataclass_ones_in_values_repr_and_hash(args, kwargs, phase):
    ours, theirs = both(_point, phase)
    a, b = ours(*args, **kwargs), theirs(*args, **kwargs)
    assert repr(a).replace("_point.<locals>.", "") == repr(b).replace("_point.<locals>.", "")
    assert dataclasses.astuple(a) == dataclasses.astuple(b)
    assert a.cached == b.cached == a.x * 10
    assert a == ours(*args, **kwargs) and hash(a) == hash(ours(*args, **kwargs))
    assert a != b  # another class, as between two dataclasses


def test_compare_false_fields_are_left_out_of_eq_and_hash(phase):
    Point, _ = both(_point, phase)
    a, b = Point(1, seen=[1]), Point(1, seen=[2])
    assert a == b and hash(a) == hash(b)
    assert Point(1) != Point(1, y=3)
    assert len({Point(1), Point(1), Point(2)}) == 2


def test_one_field_and_no_field_classes(phase):
    Single, _ = both(_single, phase)
    assert Single(1.5) == Single(1.5) and Single(1.5) != Single(2.0)
    assert hash(Single(1.5)) == hash(Single(1.5))
    nan = float("nan")
    assert Single(nan) == Single(nan)  # same object: tuples compare by identity first
    Empty, TheirEmpty = both(_empty, phase)
    assert Empty() == Empty() and hash(Empty()) == hash(Empty())
    assert repr(Empty()).endswith("Empty()")
    assert Empty().__eq__(TheirEmpty()) is NotImplemented


def test_default_factory_gives_a_new_value_per_instance(phase):
    Point, _ = both(_point, phase)
    a, b = Point(1), Point(1)
    assert a.seen == [] and a.seen is not b.seen


def test_assignment_and_deletion_raise_frozen_instance_error(phase):
    Point, _ = both(_point, phase)
    p = Point(1)
    with pytest.raises(FrozenInstanceError, match="cannot assign to field 'x'"):
        p.x = 2
    with pytest.raises(FrozenInstanceError):
        p.other = 2
    with pytest.raises(FrozenInstanceError, match="cannot delete field 'x'"):
        del p.x
    assert p.x == 1


def test_wrong_arguments_raise_as_a_function_would(phase):
    Point, _ = both(_point, phase)
    with pytest.raises(TypeError, match="missing 1 required positional argument: 'x'"):
        Point()
    with pytest.raises(TypeError, match="unexpected keyword argument 'cached'"):
        Point(1, cached=3)
    with pytest.raises(TypeError, match="takes from 2 to 6 positional arguments"):
        Point(1, 2, (), [], "l", 9)


def test_dataclass_functions_work(phase):
    Point, _ = both(_point, phase)
    p = Point(1, tags=("a",))
    assert dataclasses.is_dataclass(Point) and dataclasses.is_dataclass(p)
    assert [f.name for f in dataclasses.fields(Point)] == ["x", "y", "tags", "seen", "label",
                                                          "cached"]
    moved = dataclasses.replace(p, x=7)
    assert (moved.x, moved.tags, moved.cached) == (7, ("a",), 70)
    assert dataclasses.asdict(p)["tags"] == ("a",)
    assert Point.__match_args__ == ("x", "y", "tags", "seen", "label")
    match p:
        case Point(1, 2):
            pass
        case _:
            pytest.fail("no match")


def test_copy_and_pickle_keep_the_value():
    p = PICKLED(3, ("a",))
    assert copy.copy(p) == p and copy.deepcopy(p) == p
    assert pickle.loads(pickle.dumps(p)) == p


@frozen
class PICKLED:
    n: int
    names: tuple[str, ...] = ()


def test_subclasses_extend_fields_and_each_has_its_own_init():
    @frozen
    class Base:
        a: int
        b: int = 0

    @frozen
    class Child(Base):
        c: int = 5

    class Plain(Base):  # not a dataclass: it inherits Base's methods
        def total(self) -> int:
            return self.a + self.b

    assert Child(1, 2, 3) == Child(1, 2, 3) and Child(1).c == 5
    assert Child(1) != Base(1)
    assert Plain(1, 2).total() == 3 and Base(1, 2) == Base(1, 2)
    assert "Base.__init__" in Base.__init__.__qualname__
    assert Child.__init__ is not Base.__init__


def test_methods_a_class_writes_are_kept():
    @frozen
    class Custom:
        a: int

        def __repr__(self) -> str:
            return "custom"

        def __eq__(self, other: object) -> bool:
            return isinstance(other, Custom) and other.a % 2 == self.a % 2

    assert repr(Custom(1)) == "custom"
    assert Custom(1) == Custom(3)
    assert hash(Custom(1)) == hash(Custom(1))  # a field hash, as dataclasses adds

    @frozen
    class Hashed:
        a: int

        def __hash__(self) -> int:
            return 7

    assert hash(Hashed(1)) == 7


def test_eq_false_keeps_identity():
    @frozen(eq=False)
    class Handle:
        name: str

    a = Handle("x")
    assert a != Handle("x") and a == a
    assert len({a, Handle("x")}) == 2


def test_what_it_does_not_support_is_refused_at_definition():
    with pytest.raises(TypeError, match="non-default argument 'b' follows default argument 'a'"):
        @frozen
        class Bad:
            a: int = 0
            b: int

    with pytest.raises(TypeError, match="KW_ONLY"):
        @frozen
        class KwOnly:
            _: dataclasses.KW_ONLY
            a: int = 0

    with pytest.raises(TypeError, match="a dataclasses.field"):
        @frozen
        class TheirField:
            a: list = dataclasses.field(default_factory=list)

    with pytest.raises(ValueError, match="mutable default <class 'list'> for field a"):
        @frozen
        class MutableDefault:
            a: list = []

    with pytest.raises(TypeError, match="has no type annotation"):
        @frozen
        class Unannotated:
            a = field(default=1)

    with pytest.raises(TypeError, match="InitVar"):
        @frozen
        class WithInitVar:
            a: dataclasses.InitVar[int]

    with pytest.raises(TypeError, match="cannot overwrite attribute __setattr__"):
        @frozen
        class Settable:
            a: int

            def __setattr__(self, name, value):
                pass


@frozen(slots=True)
class Slotted:
    a: int
    names: tuple[str, ...] = ()
    extra: dict = field(default_factory=dict, compare=False)


def test_slots_make_instances_without_a_dict_that_still_copy_and_pickle():
    s = Slotted(1, ("x",))
    assert not hasattr(s, "__dict__") and Slotted.__slots__ == ("a", "names", "extra")
    assert s == Slotted(1, ("x",), {"k": 1}) and hash(s) == hash(Slotted(1, ("x",)))
    with pytest.raises(FrozenInstanceError):
        s.a = 2
    for again in (copy.copy(s), copy.deepcopy(s), pickle.loads(pickle.dumps(s))):
        assert again == s and again.names == ("x",) and type(again) is Slotted
    assert dataclasses.replace(s, a=2).a == 2
    assert Slotted.__qualname__ == "Slotted" and Slotted.__name__ == "Slotted"


def test_fields_and_replace_of_this_module_match_the_dataclasses_ones(phase):
    Point, _ = both(_point, phase)
    p = Point(1, tags=("a",))
    assert [f.name for f in frozen_module.fields(p)] == [f.name for f in dataclasses.fields(p)]
    assert frozen_module.replace(p, y=9) == dataclasses.replace(p, y=9)
    with pytest.raises(ValueError, match="init=False"):
        frozen_module.replace(p, cached=1)
    with pytest.raises(TypeError, match="unexpected keyword argument 'nope'"):
        frozen_module.replace(p, nope=1)


def test_class_variables_are_not_fields():
    from typing import ClassVar

    @frozen
    class WithClassVar:
        limit: ClassVar[int] = 5
        a: int = 0

    assert [f.name for f in frozen_module.fields(WithClassVar)] == ["a"]
    assert WithClassVar.limit == 5 and WithClassVar(2).a == 2


def test_defining_a_class_does_not_load_dataclasses():
    import subprocess
    import sys

    code = ("import sys\nfrom nri_numa.frozen import field, frozen\n"
            "@frozen\nclass A:\n    x: int\n    y: list = field(default_factory=list)\n"
            "assert A(1) == A(1) and repr(A(1)) == 'A(x=1, y=[])'\n"
            "print('dataclasses' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    assert done.stdout.strip() == "False"


def test_a_class_gets_its_compiled_init_after_enough_instances_and_keeps_behaving_alike():
    Point, _ = both(_point)
    generic = Point.__init__
    made = [Point(i, tags=("t",)) for i in range(frozen_module._COMPILE_AFTER - 1)]
    assert Point.__init__ is generic
    made.append(Point(len(made), tags=("t",)))
    assert Point.__init__ is not generic
    again = [Point(i, tags=("t",)) for i in range(frozen_module._COMPILE_AFTER)]
    assert made == again and [p.cached for p in again] == [i * 10 for i in range(len(again))]
    assert again[0].seen is not again[1].seen


def test_a_subclass_calling_the_base_init_leaves_the_base_as_it_is():
    @frozen
    class Base:
        a: int

    class Plain(Base):
        def __init__(self, a: int) -> None:
            super().__init__(a * 2)

    assert Plain(2).a == 4 and Base(2).a == 2


# Classes whose fields are all plain (no field(), nothing inherited) take a shorter path at
# definition, those whose fields are all parameters without a factory a shorter generic
# __init__: each shape below, side by side with the dataclass, in both phases of __init__.


def _plain(decorate, field):
    @decorate
    class Plain:
        a: int
        b: str
        c: tuple[int, ...] = ()
        d: frozenset[int] = frozenset()

    return Plain


def _plain_with_post_init(decorate, field):
    @decorate
    class PlainChecked:
        a: int
        b: tuple[int, ...] = ()

        def __post_init__(self) -> None:
            object.__setattr__(self, "b", tuple(sorted(self.b)))

    return PlainChecked


def _params_with_options(decorate, field):
    @decorate
    class Options:  # every field a parameter without a factory, but not plain: options
        a: int
        b: str = field(default="x", repr=False)
        c: int = field(default=0, compare=False)
        d: int = field(default=1, hash=False)

    return Options


def _no_parameter_field(decorate, field):
    @decorate
    class Derived:
        a: int
        b: int = field(init=False, default=4)
        c: list = field(init=False, default_factory=list, compare=False)

    return Derived


SHAPES = {
    "plain": (_plain, [((1, "s"), {}), ((1, "s", (2,), frozenset({3})), {}),
                       ((), {"b": "t", "a": 2, "d": frozenset()})]),
    "plain, __post_init__": (_plain_with_post_init, [((1,), {}), ((1, (3, 1, 2)), {})]),
    "parameters with options": (_params_with_options,
                                [((1,), {}), ((1, "y", 5, 6), {}), ((), {"a": 1, "c": 2})]),
    "init=False fields": (_no_parameter_field, [((1,), {}), ((), {"a": 2})]),
}


@pytest.mark.parametrize("shape", SHAPES)
def test_every_shape_of_fields_makes_the_values_the_dataclass_makes(shape, phase):
    ours, theirs = both(SHAPES[shape][0], phase)
    for args, kwargs in SHAPES[shape][1]:
        a, b = ours(*args, **kwargs), theirs(*args, **kwargs)
        assert repr(a).rpartition(".")[2] == repr(b).rpartition(".")[2]
        assert dataclasses.astuple(a) == dataclasses.astuple(b)
        again = ours(*args, **kwargs)
        assert a == again and hash(a) == hash(again) == hash(b)
        assert frozen_module.replace(a) == a
    assert ours.__match_args__ == theirs.__match_args__
    assert [(f.name, f.init, f.repr, f.compare, f.hash) for f in frozen_module.fields(ours)] == \
        [(f.name, f.init, f.repr, f.compare, f.hash) for f in dataclasses.fields(theirs)]
    assert _parameters(ours) == _parameters(theirs)


def _parameters(cls):
    """__init__'s parameters: names, kinds and defaults (@frozen keeps no annotations there)."""
    import inspect

    return [(p.name, p.kind, p.default) for p in inspect.signature(cls).parameters.values()]


@pytest.mark.parametrize("shape", SHAPES)
def test_every_shape_refuses_wrong_arguments_as_the_dataclass_does(shape, phase):
    ours, theirs = both(SHAPES[shape][0], phase)
    for args, kwargs in [((), {}), ((1, 2, 3, 4, 5), {}), ((1,), {"nope": 1})]:
        with pytest.raises(TypeError) as mine:
            ours(*args, **kwargs)
        with pytest.raises(TypeError) as dataclass_one:
            theirs(*args, **kwargs)
        assert str(mine.value).rpartition("__init__()")[2] == \
            str(dataclass_one.value).rpartition("__init__()")[2]


def test_only_classes_whose_fields_are_all_parameters_without_a_factory_take_the_short_fill():
    short = frozen_module._fill_params
    assert _plain(frozen, field).__init__.__globals__["__frozen_fill__"] is short
    assert _plain_with_post_init(frozen, field).__init__.__globals__["__frozen_fill__"] is short
    assert _params_with_options(frozen, field).__init__.__globals__["__frozen_fill__"] is short
    assert _point(frozen, field).__init__.__globals__["__frozen_fill__"] is frozen_module._fill
    assert _no_parameter_field(frozen, field).__init__.__globals__["__frozen_fill__"] is (
        frozen_module._fill)


@pytest.mark.parametrize("shape", SHAPES)
def test_every_shape_gets_its_compiled_init_after_enough_instances(shape):
    make, calls = SHAPES[shape]
    ours, theirs = both(make)
    generic = ours.__init__
    before = [ours(*args, **kwargs) for args, kwargs in calls]
    for _ in range(frozen_module._COMPILE_AFTER - len(calls)):
        ours(*calls[0][0], **calls[0][1])
    assert ours.__init__ is not generic
    after = [ours(*args, **kwargs) for args, kwargs in calls]
    assert after == before
    assert [repr(v).rpartition(".")[2] for v in after] == [
        repr(theirs(*args, **kwargs)).rpartition(".")[2] for args, kwargs in calls]


def test_a_subclass_of_a_plain_class_keeps_its_own_fields_options():
    Plain = _plain(frozen, field)

    @frozen
    class Child(Plain):
        e: int = field(default=5, repr=False, compare=False)
        f: int = 6

    assert repr(Child(1, "s")).endswith("Child(a=1, b='s', c=(), d=frozenset(), f=6)")
    assert Child(1, "s", e=7) == Child(1, "s") and hash(Child(1, "s", e=7)) == hash(Child(1, "s"))
    assert Child(1, "s", f=7) != Child(1, "s")
    assert Child.__match_args__ == ("a", "b", "c", "d", "e", "f")


def test_a_field_without_default_after_one_with_a_default_is_refused_in_every_shape():
    with pytest.raises(TypeError, match="non-default argument 'b' follows default argument 'a'"):
        @frozen
        class WithOption:
            a: int = field(default=0, repr=False)
            b: int

    with pytest.raises(TypeError, match="non-default argument 'b' follows default argument 'a'"):
        @frozen
        class AfterFactory:
            a: list = field(default_factory=list)
            b: int

    @frozen
    class Parent:
        a: int = 0

    with pytest.raises(TypeError, match="non-default argument 'b' follows default argument 'a'"):
        @frozen
        class Child(Parent):
            b: int

    @frozen
    class Fine:  # an init=False field between them is no parameter
        a: int
        b: int = field(init=False, default=0)
        c: int

    assert Fine(1, 2).c == 2 and Fine(1, 2).b == 0


def test_class_variables_init_vars_and_kw_only_are_found_however_annotated():
    import typing

    from typing import ClassVar

    namespace = {"__annotations__": {"limit": ClassVar[int], "also": typing.ClassVar,
                                     "text": "typing.ClassVar[str]", "a": int,
                                     "my_var": "MyVar", "TypeVar": "TypeVar"}}
    Mixed = frozen(type("Mixed", (), {**namespace, "limit": 3, "also": 1, "text": "t"}))
    assert [f.name for f in frozen_module.fields(Mixed)] == ["a", "my_var", "TypeVar"]
    assert Mixed.limit == 3 and Mixed(1, 2, 3).my_var == 2
    for annotation in (dataclasses.InitVar[int], "InitVar[int]", "dataclasses.InitVar"):
        with pytest.raises(TypeError, match="has no InitVar fields"):
            frozen(type("WithInitVar", (), {"__annotations__": {"a": annotation}}))
    for annotation in ("KW_ONLY", "dataclasses.KW_ONLY"):
        with pytest.raises(TypeError, match="has no KW_ONLY fields"):
            frozen(type("WithKwOnly", (), {"__annotations__": {"_": annotation}}))


@frozen(slots=True)
class SlottedPlain:
    a: int
    b: str = ""


def test_a_plain_class_with_slots_copies_and_pickles():
    s = SlottedPlain(1, "x")
    assert not hasattr(s, "__dict__") and SlottedPlain.__slots__ == ("a", "b")
    for again in (copy.copy(s), copy.deepcopy(s), pickle.loads(pickle.dumps(s))):
        assert again == s and type(again) is SlottedPlain
    for _ in range(frozen_module._COMPILE_AFTER):
        assert SlottedPlain(2).b == ""


def test_compiling_an_init_with_factories_warns_nothing_and_loads_no_warnings_module():
    import subprocess
    import sys

    code = (f"import sys\nsys.path.insert(0, {str(_repository_root())!r})\n"
            "from nri_numa.frozen import field, frozen, _compile_init\n"
            "@frozen\nclass A:\n    x: int\n    y: list = field(default_factory=list)\n"
            "    z: dict = field(init=False, default_factory=dict)\n"
            "A.__init__ = _compile_init(A)\n"
            "a, b = A(1), A(1, [2])\n"
            "assert a.y == [] and a.y is not A(1).y and b.y == [2] and a.z == {}\n"
            "print('warnings' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True,
                          text=True, check=True)
    assert (done.stdout.strip(), done.stderr) == ("False", "")
    strict = subprocess.run([sys.executable, "-I", "-W", "error::SyntaxWarning", "-c", code],
                            capture_output=True, text=True)
    assert strict.returncode == 0, strict.stderr


def _repository_root():
    from pathlib import Path

    return Path(frozen_module.__file__).resolve().parents[1]
