"""Fixtures for the benchmark client: the OpenAI streaming test double, in-process."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
