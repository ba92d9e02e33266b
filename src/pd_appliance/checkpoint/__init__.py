"""Checkpoint download and verification: the logic behind the pd_hf_checkpoint module and `pd-checkpoint`.

The Hugging Face Hub (or a mirror, or nothing at all when offline) is the source of truth for
what each file must be; the manifest in the checkpoint directory is the memory of what was
proven, so an unchanged checkpoint re-verifies in seconds.
"""

from pd_appliance.checkpoint.ensure import (
    CheckpointReport,
    CheckpointRequest,
    ensure_checkpoint,
    ensure_revision,
    verify_directory,
)
from pd_appliance.checkpoint.errors import CheckpointError, CheckpointIntegrityError, FileProblem
from pd_appliance.checkpoint.manifest import MANIFEST_NAME

__all__ = [
    "MANIFEST_NAME",
    "CheckpointError",
    "CheckpointIntegrityError",
    "CheckpointReport",
    "CheckpointRequest",
    "FileProblem",
    "ensure_checkpoint",
    "ensure_revision",
    "verify_directory",
]
