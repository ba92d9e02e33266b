"""Tuning variants: named sets of overrides of the serving role's variables, over the inventory.

A variant is what the tuner measures and may adopt:

    name: mtp-off                        # unique; not "deployed" (the configuration as served)
    description: speculative decoding off
    vars:                                # serving variables: launch flags, topology, switches
      serving_speculative_algorithm: ""
    env_hooks:                           # merged over serving_env_<key> (null removes a hook)
      decode: {SGLANG_OPT_SM120_DIRECT_SWA_KV: "1"}

The serving role applies one (roles/serving/tasks/variant.yml): it keeps the inventory's value of
every variable a variant touches (its "base", captured the first time in a run), and sets each to
the variant's value or back to the base, so switching from one variant to the next never carries
the previous one's overrides along. Env hooks become overrides of serving_env_<key> (the base
merged with the hooks). A change in a rendered program restarts that program only.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

ENV_HOOK_KEYS = ("common", "prefill", "decode", "aggregated", "router", "host")
# expect_unsupported_on_sm120: why SGLang's resolution is expected to pick a path this GPU lacks
# (tests/sglang/test_model_resolution.py holds the candidate to it instead of failing on it).
VARIANT_KEYS = frozenset({"name", "description", "vars", "env_hooks", "expect_unsupported_on_sm120"})
# Serving variables a variant may not set: the variant machinery itself (roles/variant's knobs under
# their old serving_* names, still honoured; the variant_* names are refused as no serving_* name),
# secrets (they would land in reports and the adopted-variant record), and the env hooks (use
# env_hooks, which merge).
RESERVED = frozenset(
    {
        "serving_variant",
        "serving_apply_adopted_variant",
        "serving_render_only",
        "serving_hf_token",
        "serving_router_api_key",
        "serving_supervisor_inet_password",
        "serving_env_file_vars",
        *(f"serving_env_{key}" for key in ENV_HOOK_KEYS),
    }
)
# Names a variant may override besides serving_*: none yet. A topology variable named otherwise
# (appliance_defaults) goes here.
EXTRA_NAMES: frozenset[str] = frozenset()
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
# The tuner's search names a composed candidate base+variant (pd_appliance.bench.search): each part
# a declared name. A declared variant cannot contain "+".
COMPOSED_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(\+[A-Za-z0-9][A-Za-z0-9._-]*)*$")
DEPLOYED = "deployed"


class VariantError(ValueError):
    """A variant that cannot be applied; the message names the variant, the key and the fix."""


def env_variable(key: str) -> str:
    return f"serving_env_{key}"


def variant_errors(
    variant: Any, where: str, known: Iterable[str] | None = None, composed: bool = True
) -> list[str]:
    """Everything wrong with one variant, each naming `where` (the variable or file it came from).

    `known` is the set of variable names the serving and appliance_defaults roles declare (their
    argument specs); a name outside it is a typo that would silently change nothing. With
    `composed`, a name the search composed (base+variant) passes: the serving role checks the
    candidate it is given; a declared list (variants_errors) does not allow "+".
    """
    if not isinstance(variant, Mapping):
        return [f"{where}: a variant is a mapping with name, description, vars, env_hooks; got {variant!r}"]
    name = variant.get("name")
    label = f"{where} variant {name!r}"
    errors: list[str] = []
    pattern = COMPOSED_NAME_RE if composed else NAME_RE
    if not isinstance(name, str) or not pattern.match(name):
        errors.append(
            f"{label}: name must be letters, digits, '.', '_' or '-' (it names the variant in reports)"
        )
    elif name == DEPLOYED:
        errors.append(f"{label}: '{DEPLOYED}' is the configuration as served; give the variant another name")
    unknown = sorted(set(variant) - VARIANT_KEYS)
    if unknown:
        errors.append(f"{label}: unknown keys {unknown}; a variant has {sorted(VARIANT_KEYS)}")
    overrides = variant.get("vars") or {}
    if not isinstance(overrides, Mapping):
        errors.append(f"{label}: vars must map serving variable names to values, got {overrides!r}")
        overrides = {}
    known_names = set(known) if known is not None else None
    for var in sorted(overrides):
        if var in RESERVED:
            hint = " (use env_hooks)" if var.startswith("serving_env_") else ""
            errors.append(f"{label}: vars.{var} cannot be set by a variant{hint}")
        elif not (str(var).startswith("serving_") or var in EXTRA_NAMES):
            errors.append(f"{label}: vars.{var} is not a serving variable (serving_*)")
        elif known_names is not None and var not in known_names:
            errors.append(
                f"{label}: vars.{var} is not a variable of the serving role or appliance_defaults "
                "(their meta/argument_specs.yml): a typo would change nothing"
            )
    hooks = variant.get("env_hooks") or {}
    if not isinstance(hooks, Mapping):
        errors.append(f"{label}: env_hooks must map {list(ENV_HOOK_KEYS)} to env mappings, got {hooks!r}")
        hooks = {}
    for key, env in hooks.items():
        if key not in ENV_HOOK_KEYS:
            errors.append(f"{label}: env_hooks.{key} is not one of {list(ENV_HOOK_KEYS)}")
        elif not isinstance(env, Mapping) or not all(isinstance(k, str) for k in env):
            errors.append(f"{label}: env_hooks.{key} must map variable names to values, got {env!r}")
    return errors


def variants_errors(variants: Any, where: str, known: Iterable[str] | None = None) -> list[str]:
    """variant_errors for a list, plus unique names."""
    if not isinstance(variants, Sequence) or isinstance(variants, (str, bytes)):
        return [f"{where} must be a list of variants, got {variants!r}"]
    errors = [e for v in variants for e in variant_errors(v, where, known, composed=False)]
    names = [v.get("name") for v in variants if isinstance(v, Mapping)]
    repeated = sorted({str(n) for n in names if names.count(n) > 1})
    if repeated:
        errors.append(f"{where}: variant names repeat: {repeated}")
    return errors


def override_names(variant: Mapping[str, Any] | None) -> list[str]:
    """The serving variables a variant sets: its vars, and serving_env_<key> for each env hook key."""
    if not variant:
        return []
    names = set((variant.get("vars") or {}).keys())
    names |= {env_variable(k) for k in (variant.get("env_hooks") or {})}
    return sorted(names)


def effective(base: Mapping[str, Any], variant: Mapping[str, Any] | None) -> dict[str, Any]:
    """The value of every variable in `base` (and of every one the variant sets) under `variant`.

    A name the variant does not set goes back to its base value; an env hook key merges the
    variant's hooks over the base mapping (a null value stays: the serving role's env merge
    removes that hook). Raises VariantError when the variant sets a name missing from `base`.
    """
    variant = variant or {}
    missing = [n for n in override_names(variant) if n not in base]
    if missing:
        raise VariantError(f"variant {variant.get('name')!r}: no base value captured for {missing}")
    out = dict(base)
    out.update(variant.get("vars") or {})
    for key, hooks in (variant.get("env_hooks") or {}).items():
        name = env_variable(key)
        merged = dict(base[name] or {})
        merged.update(hooks or {})
        out[name] = merged
    return out


def overridden_by_extra_vars(wanted: Mapping[str, Any], in_force: Mapping[str, Any]) -> list[str]:
    """Names whose value in force differs from what the variant set: Ansible ranks extra vars (-e)
    above the facts a variant sets, so such a name would silently keep the -e value."""
    return sorted(name for name, value in wanted.items() if in_force.get(name) != value)


def parse_record(text: str, path: str) -> dict[str, Any]:
    """The adopted-variant record in `path`, as a variant; a damaged file fails naming the fix."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise VariantError(
            f"{path} is not JSON ({exc.msg} at line {exc.lineno}): remove it to serve the inventory as is, "
            "or tune again (validation_tune=true)"
        ) from exc
    if not isinstance(data, Mapping):
        raise VariantError(f"{path} holds {type(data).__name__}, not an adopted-variant record: remove it")
    return {k: data[k] for k in ("name", "description", "vars", "env_hooks") if k in data}


def record(variant: Mapping[str, Any] | None, **details: Any) -> dict[str, Any]:
    """What the adopted-variant file holds: the overrides (what the serving role applies), then
    why it was adopted (figures, objective, time, commit)."""
    variant = variant or {}
    return {
        "name": variant.get("name", DEPLOYED),
        "description": variant.get("description", ""),
        "vars": dict(variant.get("vars") or {}),
        "env_hooks": {k: dict(v or {}) for k, v in (variant.get("env_hooks") or {}).items()},
        **details,
    }
