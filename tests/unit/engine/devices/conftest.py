"""Puts this folder's machine builders (device_boxes) on the import path for its tests."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
