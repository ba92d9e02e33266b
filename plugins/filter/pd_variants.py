"""Tuning filters: thin wrappers over pd_appliance.bench.variants (check, apply, record) and
pd_appliance.bench.search (the declared search's stages, budget and kept configurations)."""

from __future__ import annotations

import json
from typing import Any

from ansible.errors import AnsibleFilterError
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

from pd_appliance.bench import search, variants


def _effective(base: Any, variant: Any) -> dict[str, Any]:
    try:
        return variants.effective(base or {}, variant or {})
    except variants.VariantError as exc:
        raise AnsibleFilterError(str(exc)) from exc


def _errors(variant: Any, where: str, known: Any = None) -> list[str]:
    return variants.variant_errors(variant, where, known)


def _list_errors(variant_list: Any, where: str, known: Any = None) -> list[str]:
    return variants.variants_errors(variant_list, where, known)


def _argument_errors(variant_list: Any, spec: Any, where: str = "validation_variants") -> list[str]:
    """Each candidate's `vars` checked against the options they set, as validate_argument_spec checks a
    role's (ansible/plugins/action/validate_argument_spec.py: the same validator), in one task."""
    errors: list[str] = []
    # Plain data first: the validator deep-copies what it is given, and a lazy template container
    # copies its whole variable context with it (seconds a call in a play).
    variant_list = json.loads(json.dumps(list(variant_list or [])))
    spec = json.loads(json.dumps(dict(spec or {})))
    for variant in variant_list:
        values = variant.get("vars") if isinstance(variant, dict) else None
        if not isinstance(values, dict):
            continue
        subset = {name: option for name, option in spec.items() if name in values}
        result = ArgumentSpecValidator(subset).validate(dict(values), validate_role_argument_spec=True)
        errors += [f"{where}[{variant.get('name')}].vars: {message}" for message in result.error_messages]
    return errors


def _from_record(text: Any, path: str) -> dict[str, Any]:
    """A record as the file's text, or as the host state holds it (a mapping: its `variant` key)."""
    try:
        return variants.parse_record(json.dumps(dict(text)) if isinstance(text, dict) else str(text), path)
    except variants.VariantError as exc:
        raise AnsibleFilterError(str(exc)) from exc


def _record(variant: Any, details: Any = None) -> dict[str, Any]:
    return variants.record(variant or {}, **dict(details or {}))


def _search_start(declared: Any, variant_list: Any, budget_s: Any, started: Any) -> dict[str, Any]:
    try:
        return search.start(declared or [], variant_list or [], float(budget_s or 0), float(started))
    except search.SearchError as exc:
        raise AnsibleFilterError(str(exc)) from exc


def _search_end_stage(state: Any, stage: Any, measurements: Any, objective: Any) -> dict[str, Any]:
    """objective: roles/tuning's (concurrency, floors, max_error_rate, concurrency_levels)."""
    o = dict(objective)
    typed = {
        "concurrency": int(o["concurrency"]),
        "floors": {int(k): float(v) for k, v in (o.get("floors") or {}).items()},
        "max_error_rate": float(o.get("max_error_rate") or 0.0),
        "concurrency_levels": [int(c) for c in o.get("concurrency_levels") or []],
    }
    return search.end_stage(state, stage, measurements or [], typed)


class FilterModule:
    """Ansible entry point."""

    def filters(self) -> dict[str, object]:
        return {
            "pd_variant_errors": _errors,
            "pd_variants_errors": _list_errors,
            "pd_variants_argument_errors": _argument_errors,
            "pd_variant_override_names": variants.override_names,
            "pd_variant_effective": _effective,
            "pd_variant_extra_var_conflicts": variants.overridden_by_extra_vars,
            "pd_variant_record": _record,
            "pd_variant_from_record": _from_record,
            "pd_search_errors": search.search_errors,
            "pd_search_start": _search_start,
            "pd_search_begin_stage": search.begin_stage,
            "pd_search_budget": search.budget_check,
            "pd_search_record": search.record_candidate,
            "pd_search_end_stage": _search_end_stage,
        }
