"""The hook's fast path: what nri_numa/hook/fast_client.py, the file the shipped hooks run
(``python3 -I -S .../nri_numa/hook/fast_client.py STAGE ...``), imports as a top-level module
from its folder.

``-I -S`` skips ``site`` (its .pth files, an editable install's path finder) and every user
path, so nothing of nri_numa can be imported at first. ``main`` puts the package's folder on
``sys.path`` after the standard library, then the site-packages folders ``site`` would add (the
package's dependencies, for a run in process), and runs ``nri-numa hook`` with the same
arguments in this interpreter (nri_numa.cli.hook_process): the run goes to the hook daemon when
one listens (nri_numa.hook.client), else runs here as without the fast path, ``--start-daemon``
and ``--timeout`` (counted from this process's start) included.
"""

import os
import sys


def main(args):
    here = __file__.rpartition("/")[0] or "."
    if here in sys.path:  # fast_client.py put it there: its modules are not top-level ones
        sys.path.remove(here)
    sys.path.append(package_root())
    sys.path.extend(p for p in site_folders() if p not in sys.path)
    from nri_numa.cli import hook_process

    hook_process(args)


def package_root():
    """The folder that holds the nri_numa package this file belongs to."""
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def site_folders():
    """The site-packages folders ``site`` would put on sys.path (those that exist), named by
    ``site`` imported under ``-S`` (which starts nothing). In a venv (a pyvenv.cfg beside the
    interpreter or one folder up, as ``site`` looks), the venv's, and the base installation's
    too where the venv includes them. Under ``-S`` nothing made sys.prefix the venv's, which
    ``site`` does first (and Debian's ``site`` names a venv's site-packages only then): so does
    this."""
    import site

    bin_folder = os.path.dirname(sys.executable)
    venv = os.path.dirname(bin_folder)
    prefixes = None
    for folder in (bin_folder, venv):
        try:
            with open(os.path.join(folder, "pyvenv.cfg"), encoding="utf-8") as f:
                settings = f.read()
        except (OSError, UnicodeDecodeError):
            continue
        sys.prefix = sys.exec_prefix = venv
        prefixes = [venv, sys.base_prefix] if _includes_system_packages(settings) else [venv]
        break
    return [p for p in site.getsitepackages(prefixes) if os.path.isdir(p)]


def _includes_system_packages(settings):
    for line in settings.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip().lower() == "include-system-site-packages":
            return value.strip().lower() == "true"
    return False
