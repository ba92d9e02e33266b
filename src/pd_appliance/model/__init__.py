"""What the checkpoint's config.json implies for memory and transfer, computed as SGLang computes it.

Several parts of the appliance need the model's arithmetic: the rehearsal engine sizes its KV pool
like SGLang's, the fabric policy compares the KV bytes a deployment moves prefill -> decode with the
measured path, and reports put figures beside limits. They all read `pd_appliance.model.deepseek_v4`
so the numbers agree. Only the standard library is used: preflight runs this on the controller.
"""

from pd_appliance.model.deepseek_v4 import (
    DeepSeekV4Shape,
    KVPool,
    ModelConfigError,
    kv_pool,
    kv_transfer_bytes,
    load_shape,
    weight_bytes_per_rank,
)

__all__ = [
    "DeepSeekV4Shape",
    "KVPool",
    "ModelConfigError",
    "kv_pool",
    "kv_transfer_bytes",
    "load_shape",
    "weight_bytes_per_rank",
]
