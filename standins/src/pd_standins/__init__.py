"""pd_standins: what stands in, in a rehearsal, for the parts of a lab that cannot exist there.

Each stand-in replaces exactly one real part and says so wherever it shows (standins/declared.yml
lists them with the reason). None of this is installed on a lab host:

- ``pd_standins.engine``: the rehearsal engine (pd-sim-worker) in place of SGLang on GPUs;
- ``pd_standins.hub``: a Hugging Face Hub stand-in serving a tiny generated checkpoint;
- ``pd_standins.gpus``: simulated GPUs in place of what NVML reports;
- ``pd_standins.sysfs``: their PCI tree (sysfs fixtures, an lspci) in place of the host's PCI bus;
- ``pd_standins.apt_repo``: an apt repository of STAND-IN packages in place of NVIDIA's.
"""

from __future__ import annotations

__version__ = "0.1.0"
