"""The hook's fast path, as the hooks.d files and the runc example run it, by path::

    /opt/nri-numa/venv/bin/python3 -I -S .../nri_numa/hook/fast_client.py createRuntime ...

Python compiles a script it is given by path at every run but reads an imported module from
its cached bytecode. So this file only puts its own folder at the end of ``sys.path`` (after the
standard library: nothing here can shadow it) and imports its neighbour,
nri_numa/hook/fast_forward.py, which does the work.
"""

import sys

if __name__ == "__main__":
    sys.path.append(__file__.rpartition("/")[0] or ".")
    import fast_forward

    sys.exit(fast_forward.main(sys.argv[1:]))
