"""The containerd NRI snippets in packaging/ as the real containerd 1.7.24 and 2.1.9 read them:
imported into a config of the version each speaks, `containerd config dump` shows every value
where we wrote it, and a changed value proves the keys are the ones containerd reads (the
shipped values are mostly containerd's defaults, which a misplaced key would also show)."""

from __future__ import annotations

import subprocess
import tomllib
from pathlib import Path

import pytest

from tests.e2e.harness.runtimes import Runtimes

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[2]
SNIPPETS = {"1.7.24": (REPO / "packaging" / "containerd-1.7-nri.toml", 2),
            "2.1.9": (REPO / "packaging" / "containerd-2.x-nri.toml", 3)}
NRI = "io.containerd.nri.v1.nri"


def dumped_nri(runtimes: Runtimes, version: str, snippet: Path, folder: Path) -> dict[str, object]:
    """The NRI section containerd ``version`` ends up with when its config imports ``snippet``."""
    config_version = SNIPPETS[version][1]
    main = folder / f"config-{version}.toml"
    main.write_text(f'version = {config_version}\nimports = ["{snippet}"]\n')
    done = subprocess.run([str(runtimes.containerd[version].containerd), "--config", str(main),
                           "config", "dump"], capture_output=True, text=True, timeout=30,
                          check=True)
    assert "unknown key" not in done.stderr.lower(), done.stderr
    dump = tomllib.loads(done.stdout)
    assert str(snippet) in dump["imports"]
    return dump["plugins"][NRI]


@pytest.mark.parametrize("version", sorted(SNIPPETS))
def test_the_shipped_snippet_is_read_as_written(runtimes: Runtimes, version: str,
                                               tmp_path: Path) -> None:
    snippet, config_version = SNIPPETS[version]
    ours = tomllib.loads(snippet.read_text())
    assert ours["version"] == config_version
    dumped = dumped_nri(runtimes, version, snippet, tmp_path)
    for key, value in ours["plugins"][NRI].items():
        assert dumped.get(key) == value, f"containerd {version} reads {key} as {dumped.get(key)!r}"
    assert dumped["disable"] is False and dumped["disable_connections"] is False


@pytest.mark.parametrize("version", sorted(SNIPPETS))
def test_changed_values_in_the_snippet_reach_containerd(runtimes: Runtimes, version: str,
                                                        tmp_path: Path) -> None:
    snippet, _ = SNIPPETS[version]
    text = snippet.read_text()
    changed = {"/var/run/nri/nri.sock": "/run/elsewhere/nri.sock", '"2s"': '"7s"',
               '"5s"': '"9s"', '"/opt/nri/plugins"': '"/opt/other/plugins"'}
    for old, new in changed.items():
        assert old in text
        text = text.replace(old, new)
    edited = tmp_path / snippet.name
    edited.write_text(text)
    dumped = dumped_nri(runtimes, version, edited, tmp_path)
    assert (dumped["socket_path"], dumped["plugin_request_timeout"],
            dumped["plugin_registration_timeout"], dumped["plugin_path"]) == (
        "/run/elsewhere/nri.sock", "7s", "9s", "/opt/other/plugins")
