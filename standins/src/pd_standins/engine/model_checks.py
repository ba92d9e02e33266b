"""What SGLang 0.5.23 refuses for the model it serves, after its parser accepted the flags.

SGLang's parser accepts any `--speculative-algorithm` string; the model decides later. In
`python -m sglang.launch_server`, `run_server` calls `ServerArgs.resolve_once()`
(sglang/srt/server_args.py), whose resolution pipeline (sglang/srt/arg_groups/pipeline.py,
`run_resolution_pipeline`) runs `handle_model_specific_adjustments`
(sglang/srt/arg_groups/model_hook.py) on `hf_config.architectures[0]` of the checkpoint's
config.json. For `DeepseekV4ForCausalLM` that calls `apply_deepseek_v4_defaults`
(sglang/srt/arg_groups/deepseek_v4_hook.py), whose asserts are reproduced here. It runs *before*
`handle_speculative_decoding` (sglang/srt/arg_groups/speculative_hook.py), which is where NEXTN
becomes an alias of EAGLE (`_resolve_speculative_algorithm_alias`): so `--speculative-algorithm
NEXTN`, the spelling many DeepSeek guides use for MTP, is refused on DeepSeek-V4, and EAGLE
needs `--speculative-eagle-topk 1` given explicitly (the field's default is None, not 1:
sglang/srt/arg_groups/fields/spec.py).

Nothing catches the AssertionError: launch_server's `__main__` only kills its child processes in
a `finally`, so the process prints the traceback and exits with status 1, before it listens on
any port. The rehearsal engine does the same: `refuse` raises the same AssertionError with the
same message, and the caller lets it propagate.

The engine knows which architecture it serves from `<--model-path>/config.json`, as SGLang
does; a model path without one (a test's "simulated-model") is served without these checks.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

DEEPSEEK_V4 = "DeepseekV4ForCausalLM"
# apply_deepseek_v4_defaults: `assert cfg.speculative_algorithm in ("EAGLE", "DSPARK")`. The
# comparison is on the string as given (no upper-casing before it).
DEEPSEEK_V4_SPECULATIVE = ("EAGLE", "DSPARK")


def model_arch(model_path: str | None) -> str | None:
    """`architectures[0]` of the checkpoint's config.json (what SGLang's model hooks key on);
    None when the model path has no readable config.json."""
    if not model_path:
        return None
    try:
        config = json.loads((Path(model_path) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    architectures = config.get("architectures") if isinstance(config, dict) else None
    if isinstance(architectures, list) and architectures and isinstance(architectures[0], str):
        return architectures[0]
    return None


def given_values(ignored: Sequence[str], table: Mapping[str, Any]) -> dict[str, list[str]]:
    """The values of the SGLang flags the simulation does not read, by argparse dest.

    `ignored` is the engine's record of them (`sim_ignored`: each flag's full option string, as
    argparse resolved any abbreviation, then its values); `table` is SGLang's flag table. A flag
    given twice keeps its last values, as argparse's store action does.
    """
    by_option = {o: f for f in table["flags"] for o in f["options"]}
    out: dict[str, list[str]] = {}
    i = 0
    while i < len(ignored):
        flag = by_option.get(ignored[i])
        i += 1
        if flag is None:
            continue
        nargs = flag["nargs"]
        if nargs is None or isinstance(nargs, int):
            count = 1 if nargs is None else nargs
        else:  # "?", "*", "+": its values run up to the next option string
            count = next((j for j, t in enumerate(ignored[i:]) if t in by_option), len(ignored) - i)
        out[flag["dest"]] = list(ignored[i : i + count])
        i += count
    return out


def deepseek_v4_refusals(values: Mapping[str, list[str]], arch: str) -> list[str]:
    """The speculative-decoding asserts of apply_deepseek_v4_defaults, in its order and words."""
    algorithm = (values.get("speculative_algorithm") or [None])[0]
    if algorithm is None:
        return []
    if algorithm not in DEEPSEEK_V4_SPECULATIVE:
        return [f"Only EAGLE and DSPARK speculative algorithms are supported for {arch}"]
    topk = (values.get("speculative_eagle_topk") or [None])[0]
    if algorithm == "EAGLE" and (topk is None or int(topk) != 1):
        return [f"Only EAGLE speculative algorithm with topk == 1 is supported for {arch}"]
    return []


def refusals(args: argparse.Namespace, table: Mapping[str, Any]) -> list[str]:
    """Every model-level refusal for these parsed flags (the first is the one SGLang raises)."""
    arch = model_arch(getattr(args, "model_path", None))
    if arch != DEEPSEEK_V4:
        return []
    values = given_values(getattr(args, "sim_ignored", []), table)
    # A flag the simulation reads (cli.HONOURED) is in the namespace instead.
    values.update({k: [v] for k, v in vars(args).items() if k.startswith("speculative_") and v is not None})
    return deepseek_v4_refusals(values, arch)


def refuse(args: argparse.Namespace, table: Mapping[str, Any]) -> None:
    """Raise SGLang's AssertionError for the first refusal (the engine then exits 1 with the
    traceback, as `python -m sglang.launch_server` does)."""
    found = refusals(args, table)
    if found:
        raise AssertionError(found[0])
