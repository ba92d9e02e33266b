"""Without a CUDA GPU the kernel tests run under the Triton interpreter on CPU tensors.

TRITON_INTERPRET is read when a kernel is decorated, so it is set here, before any test module
imports pd_kernels.sparse_mla_decode.
"""

import os

try:
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
except ImportError:  # the test modules skip themselves
    pass
