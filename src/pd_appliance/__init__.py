"""pd-appliance: provisioning and serving of DeepSeek-V4-Flash on SGLang prefill/decode disaggregation.

The package holds every piece of logic the Ansible side calls: GPU facts, checkpoint download and
verification, the benchmark client, the rehearsal engine, the patch-series manager and the kernels.
Ansible modules and filters stay thin wrappers around it.
"""

__version__ = "0.1.0"
