"""SGLang filters: thin wrappers over pd_appliance.sglang_args (env hook names vs SGLang's registry)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pd_appliance.sglang_args.registry import EnvRegistry, RegistryError, env_name_errors, variant_sources


def pd_sglang_env_errors(
    sources: Mapping[str, Any], host: str, registry_path: str, variants: Any = None
) -> list[str]:
    """Messages for SGLang env names SGLang would not honour. `sources` maps each env hook
    variable to its value (a mapping; only its keys are read) or to a list of names;
    `variants` is validation_variants, whose env_hooks are checked too."""
    names = {label: [str(k) for k in (value or [])] for label, value in (sources or {}).items()}
    names.update(variant_sources(variants))
    try:
        registry = EnvRegistry.load(registry_path)
    except RegistryError as exc:
        return [f"{host}: {exc}"]
    return env_name_errors(host, names, registry)


class FilterModule:
    """Ansible entry point."""

    def filters(self) -> dict[str, object]:
        return {"pd_sglang_env_errors": pd_sglang_env_errors}
