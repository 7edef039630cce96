"""The fake device plugin's device list (flags and file): any value in any field, any text as
the file, any --device text is read or refused with one line, never an exception of another
kind; what it reads is always what the kubelet accepts (a valid resource, unique ids of at most
63 characters, NUMA nodes >= 0)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nri_numa.fake_device_plugin.devices import (MAX_ID_LENGTH, DeviceList, DeviceListError,
                                                 device_from_flag, devices_from_mapping,
                                                 read_device_file)
from tests.property.bad_input import TEXT, VALUE, YAML_TEXT, check_line, examples, with_value

GOOD = {"resource": "example.com/gpu", "devices": [{"id": "a", "numa": [0], "health": "Healthy"}]}
FIELDS = [("resource",), ("devices",), ("devices", 0), ("devices", 0, "id"),
          ("devices", 0, "numa"), ("devices", 0, "numa", 0), ("devices", 0, "health")]


def check_read(devices: DeviceList) -> None:
    assert devices.resource.count("/") == 1
    ids = [d.id for d in devices.devices]
    assert len(ids) == len(set(ids)) and all(0 < len(i) <= MAX_ID_LENGTH for i in ids)
    assert all(n >= 0 for d in devices.devices for n in d.numa)


@settings(max_examples=examples(300), deadline=None)
@given(st.sampled_from(FIELDS), VALUE)
def test_any_value_in_any_field_is_read_or_one_line(path: tuple, value: Any) -> None:
    try:
        check_read(devices_from_mapping(with_value(GOOD, path, value)))
    except DeviceListError as e:
        check_line(str(e))


@settings(max_examples=examples(200), deadline=None)
@given(TEXT)
def test_any_device_flag_is_read_or_one_line(text: str) -> None:
    try:
        device = device_from_flag(text)
    except DeviceListError as e:
        check_line(str(e))
        return
    assert 0 < len(device.id) <= MAX_ID_LENGTH and all(n >= 0 for n in device.numa)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("devices")


@settings(max_examples=examples(200), deadline=None)
@given(YAML_TEXT)
def test_any_file_text_is_read_or_one_line_naming_the_file(folder: Path, text: str) -> None:
    path = folder / "devices.yaml"
    path.write_text(text, errors="surrogateescape")
    try:
        check_read(read_device_file(path))
    except DeviceListError as e:
        check_line(str(e))
        assert str(path) in str(e)
