"""The KV transfer rate a PD deployment needs between prefill and decode, from the model and the target.

Whether a prefill -> decode pair may go without P2P (two sockets, KV staged through host memory)
is not a yes/no rule: it depends on how many bytes the workload moves. The formula, for one
prefill TP rank and the decode rank it writes to (a *rank pair*):

    requests/s          = target_output_tok_s / output_len       each request yields output_len tokens
    prompt tokens/s     = requests/s * input_len                 = target * input_len / output_len
    need (bytes/s)      = prompt tokens/s * kv_bytes_per_token   KV of one rank, per token

Every prompt token's KV crosses prefill -> decode once, per TP rank pair: prefill runs the prompt,
then SGLang's NIXL connector WRITEs each rank's KV pages into its decode peer (the decode's own
output tokens never cross back). `kv_bytes_per_token` is one rank's share as SGLang lays the KV out.
For DeepSeek-V4 it comes from the checkpoint's config.json through pd_appliance.model: one
request hands over every prompt token compressed plus the last sliding window uncompressed on
every layer (`kv_transfer_bytes`), so the bytes per prompt token are that over input_len (MLA's
single latent KV head: every TP rank holds and sends it whole).

The lab's target line (inventory/lab/group_vars/all/validation.yml): 1000 output tok/s at C=16 with
1024-token prompts and 128 output tokens, so 1000 * 1024 / 128 = 8000 prompt tokens/s cross each
rank pair. The check then asks the measured path for `margin` times the need (default 10x): the
need is an average, while KV arrives in bursts (a prefill batch finishes at once), the first
transfers pay UCX's warm-up, and the rank pairs of one host share the host's staging path.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from pd_appliance.model import DeepSeekV4Shape, kv_transfer_bytes

DEFAULT_MARGIN = 10.0


@dataclass(frozen=True)
class KvNeed:
    """The KV rate one prefill -> decode rank pair must carry at the target line."""

    kv_bytes_per_token: float
    target_output_tok_s: float
    concurrency: int | None
    input_len: int
    output_len: int
    margin: float = DEFAULT_MARGIN
    # Where kv_bytes_per_token came from (config.json and how, or the variable that set it).
    source: str = ""

    @property
    def prompt_tok_s(self) -> float:
        """Prompt tokens per second: target output tok/s * input_len / output_len."""
        return self.target_output_tok_s * self.input_len / self.output_len

    @property
    def need_gb_s(self) -> float:
        """Decimal GB/s (1e9 bytes, as the NIXL check reports) one rank pair must move."""
        return self.prompt_tok_s * self.kv_bytes_per_token / 1e9

    @property
    def required_gb_s(self) -> float:
        """What the measured path must reach: the need times the margin."""
        return self.need_gb_s * self.margin

    def basis(self) -> str:
        """The arithmetic in one line, so every figure in a finding can be checked by hand."""
        at = f" at C={self.concurrency}" if self.concurrency is not None else ""
        return (
            f"{self.target_output_tok_s:g} output tok/s{at} x {self.input_len}/{self.output_len} "
            f"prompt/output tokens = {self.prompt_tok_s:g} prompt tok/s x {self.kv_bytes_per_token:.1f} KV "
            f"bytes/token/rank = {self.need_gb_s:.4g} GB/s per TP rank pair"
            + (f" (KV bytes from {self.source})" if self.source else "")
        )

    @classmethod
    def from_dict(cls, values: Mapping[str, Any] | None) -> KvNeed | None:
        """The need back from `as_dict` (what a role passed on); None for an empty or failed one."""
        if not values or values.get("error"):
            return None
        return cls(
            kv_bytes_per_token=float(values["kv_bytes_per_token"]),
            target_output_tok_s=float(values["target_output_tok_s"]),
            concurrency=None if values.get("concurrency") is None else int(values["concurrency"]),
            input_len=int(values["input_len"]),
            output_len=int(values["output_len"]),
            margin=float(values.get("margin", DEFAULT_MARGIN)),
            source=str(values.get("source") or ""),
        )

    def as_dict(self) -> dict[str, Any]:
        """The inputs and the derived figures (what the roles pass on and print)."""
        return asdict(self) | {
            "prompt_tok_s": self.prompt_tok_s,
            "need_gb_s": self.need_gb_s,
            "required_gb_s": self.required_gb_s,
            "basis": self.basis(),
        }


def _positive(name: str, value: Any, fix: str) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a positive number, got {value!r}; {fix}") from None
    if number <= 0:
        raise ValueError(f"{name} must be a positive number, got {value!r}; {fix}")
    return number


def target_line(targets: Mapping[Any, Any]) -> tuple[int | None, float]:
    """(concurrency, output tok/s) of the most demanding entry of validation_target_output_tok_s.

    The target is a map concurrency -> aggregate output tok/s ({1: 210, 16: 1000} in the lab); the
    KV path must carry the highest rate, which is the one at the highest concurrency in practice.
    """
    if not targets:
        raise ValueError(
            "validation_target_output_tok_s is empty, so the KV rate the deployment needs is unknown; "
            "set it (e.g. {16: 1000}) or an explicit nixl_check_min_bandwidth_gb_s"
        )
    best: tuple[int | None, float] | None = None
    for key, value in targets.items():
        rate = _positive(f"validation_target_output_tok_s[{key}]", value, "give output tok/s per concurrency")
        concurrency = int(key) if str(key).isdigit() else None
        if best is None or rate > best[1]:
            best = (concurrency, rate)
    assert best is not None
    return best


def kv_need(
    kv_bytes_per_token: Any,
    targets: Mapping[Any, Any],
    input_len: Any,
    output_len: Any,
    margin: Any = DEFAULT_MARGIN,
    source: str = "appliance_kv_bytes_per_token",
) -> KvNeed:
    """The need for the deployment's target line (see the module docstring for the formula)."""
    kv = _positive(
        "the KV bytes per token (appliance_kv_bytes_per_token)",
        kv_bytes_per_token,
        "it comes from the checkpoint's config.json (pd_appliance.model); set it only for another model",
    )
    concurrency, rate = target_line(targets)
    return KvNeed(
        kv_bytes_per_token=kv,
        target_output_tok_s=rate,
        concurrency=concurrency,
        input_len=int(
            _positive("validation_input_len", input_len, "the prompt length the target is measured at")
        ),
        output_len=int(
            _positive("validation_output_len", output_len, "the output length the target is measured at")
        ),
        margin=_positive("appliance_kv_margin", margin, "how many times the need the path must carry (10)"),
        source=source,
    )


def kv_bytes_per_prompt_token(config: Mapping[str, Any], input_len: int) -> tuple[float, str]:
    """(KV bytes one rank sends per prompt token, how) for a DeepSeek-V4 config.json at `input_len`.

    pd_appliance.model.kv_transfer_bytes gives one request's handover (every prompt token
    compressed plus the last window uncompressed on every layer); spread over the prompt's tokens.
    Raises pd_appliance.model.ModelConfigError (a ValueError) naming the field for another config.
    """
    shape = DeepSeekV4Shape.from_config(config)
    per_request = kv_transfer_bytes(shape, input_len)
    return per_request / input_len, (
        f"config.json: {shape.num_hidden_layers} layers, window {shape.window_size}; "
        f"{per_request:.0f} bytes per {input_len}-token prompt per rank, pd_appliance.model.kv_transfer_bytes"
    )


def need_for_deployment(
    config: Mapping[str, Any] | None,
    kv_bytes_per_token: Any,
    targets: Mapping[Any, Any],
    input_len: Any,
    output_len: Any,
    margin: Any = DEFAULT_MARGIN,
) -> KvNeed:
    """The need from an explicit KV size (it wins), else from the checkpoint's config.json.

    Raises ValueError naming what to set when neither is there (a host whose checkpoint is not
    downloaded yet and no appliance_kv_bytes_per_token).
    """
    if kv_bytes_per_token not in (None, "", 0, "0"):
        return kv_need(kv_bytes_per_token, targets, input_len, output_len, margin)
    if not config:
        raise ValueError(
            "the KV bytes per token are not known: the checkpoint's config.json is not on this host yet "
            "(run the checkpoint stage first) and appliance_kv_bytes_per_token is not set"
        )
    length = int(_positive("validation_input_len", input_len, "the prompt length the target is measured at"))
    per_token, source = kv_bytes_per_prompt_token(config, length)
    return kv_need(per_token, targets, length, output_len, margin, source)
