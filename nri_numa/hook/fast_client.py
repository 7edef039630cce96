"""The hook's fast path, as the hooks.d files and the runc example run it, by path::

    /opt/nri-numa/venv/bin/python3 -I -S .../nri_numa/hook/fast_client.py createRuntime ...

Python compiles a script it is given by path at every run (5-10 ms of a 20 ms budget on the
project's VM) but reads an imported module from its cached bytecode. So this file only puts its
own folder at the end of ``sys.path`` (after the standard library: nothing here can shadow it)
and imports the client, nri_numa/hook/fast_forward.py, which does the work with built-in modules
only.
"""

import sys

if __name__ == "__main__":
    sys.path.append(__file__.rpartition("/")[0] or ".")
    import fast_forward

    sys.exit(fast_forward.main(sys.argv[1:]))
