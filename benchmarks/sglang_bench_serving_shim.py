"""Run SGLang 0.5.23's own bench_serving (sglang/benchmark/serving.py of the pinned wheel) without torch.

    VENV/bin/python benchmarks/sglang_bench_serving_shim.py SGLANG_SRC [bench_serving args]

serving.py itself needs only aiohttp/numpy/transformers, but it imports two names from
sglang.srt (FAKE_BOOTSTRAP_HOST, resolve_base_url/resolve_host_port) whose modules pull in torch,
and `sglang/__init__` pulls in the whole runtime. This shim registers stand-ins for exactly
those (same values and semantics as in the wheel), a `datasets` stand-in (only the random
dataset is used), and builds a small local word-level tokenizer (no Hub here); everything else,
including the request loop and calculate_metrics, is SGLang's own code, unmodified, read from
SGLANG_SRC (the extracted wheel). Nothing of SGLang is copied.

`--tokenizer` is filled in with the local tokenizer unless given.
"""

from __future__ import annotations

import sys
import tempfile
import types
from pathlib import Path


def _stub(name: str, path: str | None = None, **attrs: object) -> None:
    module = types.ModuleType(name)
    if path is not None:
        module.__path__ = [path]  # a package whose __init__ is skipped
    module.__dict__.update(attrs)
    sys.modules[name] = module


def _resolve_base_url(base_url: str, host: str, port: int) -> str:
    return base_url or f"http://{host}:{port}"


def _resolve_host_port(base_url: str, host: str, port: int) -> str:
    return base_url or f"{host}:{port}"


def _load_dataset(*args: object, **kwargs: object) -> None:
    raise RuntimeError("the shim supports only --dataset-name random (no `datasets` library here)")


def build_tokenizer(directory: Path, vocab_size: int = 2000) -> Path:
    """A word-level tokenizer with `vocab_size` words, saved as a transformers tokenizer directory."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, **{f"w{i}": i + 1 for i in range(vocab_size - 1)}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(
        '{"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "[UNK]", "model_max_length": 1000000}'
    )
    return directory


def main() -> None:
    src = Path(sys.argv[1]).resolve()
    args = sys.argv[2:]
    sys.path.insert(0, str(src))
    _stub("sglang", str(src / "sglang"))
    _stub("sglang.srt", str(src / "sglang" / "srt"))
    _stub("sglang.srt.disaggregation", str(src / "sglang" / "srt" / "disaggregation"))
    _stub("sglang.srt.disaggregation.utils", FAKE_BOOTSTRAP_HOST="2.2.2.2")
    _stub("sglang.srt.utils", str(src / "sglang" / "srt" / "utils"))
    _stub(
        "sglang.srt.utils.network", resolve_base_url=_resolve_base_url, resolve_host_port=_resolve_host_port
    )
    _stub("datasets", load_dataset=_load_dataset)
    if "--tokenizer" not in args:
        args += ["--tokenizer", str(build_tokenizer(Path(tempfile.mkdtemp()) / "tok"))]
    from sglang.benchmark import serving

    sys.argv = ["bench_serving", *args]
    serving.cli_main()


if __name__ == "__main__":
    main()
