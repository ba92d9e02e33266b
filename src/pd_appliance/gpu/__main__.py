"""`python -m pd_appliance.gpu`: print the GPU facts as JSON (exit 2 with the diagnosis on failure)."""

from __future__ import annotations

import json
import sys

from pd_appliance.gpu.errors import GpuFactsError
from pd_appliance.gpu.facts import gather_gpu_facts


def main() -> int:
    """Print the facts, or the cause and fix, as one JSON document."""
    try:
        facts = gather_gpu_facts()
    except GpuFactsError as err:
        print(json.dumps({"failed": True, **err.as_dict()}, indent=2))
        return 2
    print(json.dumps(facts, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
