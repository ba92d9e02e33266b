"""Releases: what the appliance serves, recorded, compared, accepted, rolled back and pruned.

A release is everything that decides what prefill, decode and the router compute: the SGLang
version with the patch series and the lock its venv was built from, NIXL's version, the checkpoint
revision (and its manifest's digest), the adopted tuning variant, and the rendered supervisor
program of every PD program (flags and env hooks). Each SGLang build has its own venv and each
checkpoint revision its own directory, side by side, so a new release is installed next to the
one serving, and the programs name the paths of their release on their command line.

- `build`: the controller-side digest that names a venv (SGLang version + series + locks).
- `inspect`: what a host has installed (the venv's versions and series, a revision's manifest).
- `record`: the release record, its id, what changed between two, the restarts it needs.
- `store`: the host's release state (records, current, accepted, failed, history) and pruning.
- `rollout`: restarting the changed programs in an order that keeps serving where it can.
"""

from pd_appliance.release.errors import ReleaseError

__all__ = ["ReleaseError"]
