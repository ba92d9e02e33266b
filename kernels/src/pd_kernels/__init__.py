"""GPU kernels the appliance patches into SGLang (Triton; torch and triton are imported lazily).

`pd_kernels.sparse_mla_decode` is the split-KV sparse-MLA decode for DeepSeek-V4's paged
FP8 cache; `pd_kernels.reference` holds its float64 reference and cache packing helpers.
Importing this package needs neither torch nor triton.
"""
