"""The SGLang patch series: a strict unified-diff applier and the idempotent series state."""

from pd_appliance.patches.diff import PatchError, apply_file_patch, parse_patch
from pd_appliance.patches.series import SeriesResult, apply_series, load_series

__all__ = ["PatchError", "SeriesResult", "apply_file_patch", "apply_series", "load_series", "parse_patch"]
