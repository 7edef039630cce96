import sys

from nri_numa.hook.c_client import main

sys.exit(main())
