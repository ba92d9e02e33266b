"""Proof-record filters: thin wrappers over pd_appliance.proofs (skip a proof whose inputs did not change).

They run on the controller: the digest is taken there from the inputs the play already holds, and the
record (read from the host with slurp) is judged there, so no host needs pd_appliance for it.
"""

from __future__ import annotations

import base64
from typing import Any

from pd_appliance import proofs


def pd_proof_digest(inputs: Any) -> str:
    """sha256 of the inputs as canonical JSON."""
    return proofs.digest(inputs)


def pd_tree_digest(paths: list[str], suffixes: list[str] | None = None) -> str:
    """sha256 of the controller files under `paths` (names and contents)."""
    return proofs.tree_digest(paths, tuple(suffixes or ()))


def pd_proof_decide(
    slurped: dict[str, Any] | None, name: str, input_digest: str, force: bool = False
) -> dict[str, Any]:
    """{run, reason, line, result} from a slurp result of the record (a failed slurp: no record)."""
    content = (slurped or {}).get("content")
    text = base64.b64decode(content).decode(errors="replace") if content else None
    # "-e appliance_force_checks=false" arrives as a string: only a true word forces.
    forced = force if isinstance(force, bool) else str(force).strip().lower() in ("true", "yes", "on", "1")
    return proofs.decide(name, text, input_digest, forced)


def pd_proof_record(result: Any, name: str, input_digest: str) -> str:
    """The JSON record of a proof that passed now."""
    return proofs.new_record(name, input_digest, result).to_json()


class FilterModule:
    """Ansible entry point."""

    def filters(self) -> dict[str, Any]:
        return {
            "pd_proof_digest": pd_proof_digest,
            "pd_tree_digest": pd_tree_digest,
            "pd_proof_decide": pd_proof_decide,
            "pd_proof_record": pd_proof_record,
        }
