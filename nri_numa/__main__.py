import sys

from nri_numa.cli import main

sys.exit(main())
