"""`python -m demo`: see demo/cli.py. A Ctrl-C while the modules load (nothing started yet)
ends quietly with status 130."""

import sys

try:
    from demo.cli import main
except KeyboardInterrupt:
    print("demo: interrupted before it started anything", file=sys.stderr)
    sys.exit(130)

sys.exit(main())
