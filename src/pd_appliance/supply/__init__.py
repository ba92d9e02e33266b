"""The SGLang venv's supply chain: hashed locks, which Python they fit, and trusted keys.

- ``lock``: read a uv-generated hashed lock, take subsets and dependency closures of it, and check it
  against a wheel's own Requires-Dist (the CI check that every pin of the release is honoured).
- ``pythons``: which Python builds the SGLang venv on a host (the host's, where a lock exists for its
  version, or a uv-managed one), and the preflight messages when neither fits.
- ``sources``: the rule for package sources and mirrors (https, unless a checksum covers what they serve).
- ``keyring``: OpenPGP fingerprints of the keys inside a keyring .deb (NVIDIA's cuda-keyring).
- ``generate``: the command that regenerates the locks with uv (``python -m pd_appliance.supply.generate``).
"""
