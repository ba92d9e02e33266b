"""The rehearsal engine's DeepSeek-V4 refusals (pd_standins.engine.model_checks) are SGLang 0.5.23's.

Read from the pinned wheel's source: apply_deepseek_v4_defaults asserts the speculative algorithm
and EAGLE's topk with these messages, keyed on the architecture DeepseekV4ForCausalLM, and the
resolution pipeline runs the model hook before the speculative hook (where NEXTN becomes EAGLE).
"""

from __future__ import annotations

import re
import zipfile
from pathlib import Path

from pd_standins.engine import model_checks

HOOK = "sglang/srt/arg_groups/deepseek_v4_hook.py"
MODEL_HOOK = "sglang/srt/arg_groups/model_hook.py"
PIPELINE = "sglang/srt/arg_groups/pipeline.py"


def _source(wheel: Path, member: str) -> str:
    with zipfile.ZipFile(wheel) as archive:
        return archive.read(member).decode()


def _flat(text: str) -> str:
    """The source with its implicit string concatenation and line breaks gone."""
    return re.sub(r'"\s+"', "", re.sub(r"\s+", " ", text))


def test_the_messages_and_the_accepted_algorithms_are_the_wheels(sglang_wheel: Path) -> None:
    hook = _flat(_source(sglang_wheel, HOOK))
    arch = "{model_arch}"
    for message in model_checks.deepseek_v4_refusals({"speculative_algorithm": ["NEXTN"]}, arch) + (
        model_checks.deepseek_v4_refusals({"speculative_algorithm": ["EAGLE"]}, arch)
    ):
        assert f'f"{message}"' in hook, message
    accepted = ", ".join(f'"{a}"' for a in model_checks.DEEPSEEK_V4_SPECULATIVE)
    assert f"assert cfg.speculative_algorithm in ( {accepted}, )" in hook
    assert "assert cfg.speculative_eagle_topk == 1" in hook


def test_the_model_hook_runs_before_the_alias_and_keys_on_the_architecture(sglang_wheel: Path) -> None:
    model_hook = _flat(_source(sglang_wheel, MODEL_HOOK))
    assert f'if model_arch in [ "{model_checks.DEEPSEEK_V4}", ]:' in model_hook
    assert "apply_deepseek_v4_defaults(server_args, model_arch)" in model_hook
    assert "model_arch = hf_config.architectures[0]" in model_hook
    pipeline = _source(sglang_wheel, PIPELINE)
    assert pipeline.index("run_hook(handle_model_specific_adjustments") < pipeline.index(
        "run_hook(handle_speculative_decoding"
    )
