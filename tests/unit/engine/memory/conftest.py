"""Puts this folder's builders module on the import path for its tests."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
