"""Runs inside a venv that holds the real (patched) SGLang wheel: its parser and its env registry.

Called as `python -m pd_appliance.sglang_args.introspect OP OUT` with a JSON request on stdin;
the JSON answer goes to the file OUT, because SGLang's imports may print to stdout.

- parse: each argv through `sglang.srt.server_args.prepare_server_args`, the function
  `python -m sglang.launch_server` and `sglang serve` call on sys.argv[1:]; argparse's refusal
  (exit status 2 and its message) or any other error is reported, not raised.
- flags: the parser prepare_server_args builds (caught as it parses), described as data:
  option strings, dest, nargs, type name, choices, required. Enough for another argparse
  parser to accept and refuse the same command lines (the rehearsal engine's flag table).
- environ-names: the fields of `sglang.srt.environ.Envs`, its deprecated names with SGLang's
  advice, and the SGLANG_* names SGLang's code reads straight from os.environ.
- resolve: each argv (its --model-path a local checkpoint directory) through SGLang's own
  resolution on a GPU reported as the request's (compute capability (12, 0) for the lab): see
  `resolve_all`. Runs in a process of its own: it pretends CUDA for the whole process.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.abc
import importlib.machinery
import io
import json
import os
import re
import sys
import types
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# An SGLANG_* literal as an env read: reader(NAME...), environ[NAME], NAME in environ.
_NAME = rb"""["'](SGLANG_[A-Z0-9_]+)["']"""
_ENV_READ = re.compile(
    rb"|".join(
        [
            rb"(?:environ\.get|getenv|environ\.pop|environ\.setdefault|_env_var)\(\s*" + _NAME,
            rb"environ\[\s*" + _NAME + rb"\s*\]",
            _NAME + rb"\s+(?:not\s+)?in\s+(?:os\.)?environ\b",
        ]
    )
)
# Packages of the wheel that `python -m sglang.launch_server` never loads, or that are tests.
_SKIP_PARTS = {"test", "tests", "multimodal_gen", "benchmark", "__pycache__"}


def parse(argv: Sequence[str], fields: Sequence[str] = ()) -> dict[str, Any]:
    """SGLang's verdict on one argv: ok, exit status (argparse: 2), what it printed, and the
    values it parsed for `fields` (ServerArgs attribute names) when it accepted the argv."""
    from sglang.srt.server_args import prepare_server_args

    printed = io.StringIO()
    try:
        with contextlib.redirect_stderr(printed), contextlib.redirect_stdout(printed):
            server_args = prepare_server_args(list(argv))
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
        return {
            "ok": code == 0,
            "exit_code": code,
            "message": _without_usage(printed.getvalue()),
            "values": {},
        }
    except Exception as exc:  # anything prepare_server_args raises is a refusal too
        return {"ok": False, "exit_code": None, "message": f"{type(exc).__name__}: {exc}", "values": {}}
    values = {f: _plain(getattr(server_args, f, None)) for f in fields}
    return {"ok": True, "exit_code": 0, "message": _without_usage(printed.getvalue()), "values": values}


def _plain(value: Any) -> Any:
    return value if isinstance(value, (str, int, float, bool, type(None))) else str(value)


def _without_usage(text: str) -> str:
    """What argparse printed, less its usage block (500 flags long for SGLang)."""
    lines = text.strip().splitlines()
    errors = [i for i, line in enumerate(lines) if ": error: " in line]
    return "\n".join(lines[errors[0] :] if errors else lines[-20:])


def real_parser() -> argparse.ArgumentParser:
    """The ArgumentParser that prepare_server_args builds and parses with, caught in the act."""
    from sglang.srt.server_args import prepare_server_args

    caught: list[argparse.ArgumentParser] = []
    original = argparse.ArgumentParser.parse_args

    def spy(self: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> Any:
        caught.append(self)
        return original(self, *args, **kwargs)

    argparse.ArgumentParser.parse_args = spy  # type: ignore[method-assign]
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            prepare_server_args(["--model-path", "pd-appliance-probe"])
    finally:
        argparse.ArgumentParser.parse_args = original  # type: ignore[method-assign]
    if not caught:
        raise RuntimeError("prepare_server_args parsed nothing through argparse: the parser moved")
    return caught[0]


def _type_name(action: argparse.Action) -> str | None:
    if action.type is None:
        return None if action.nargs == 0 else "str"
    return getattr(action.type, "__name__", type(action.type).__name__)


def _choices(action: argparse.Action) -> list[Any] | None:
    if action.choices is None:
        return None
    values = [c if isinstance(c, (str, int, float, bool)) else str(c) for c in action.choices]
    if isinstance(action.choices, (set, frozenset)):
        values.sort(key=str)
    return values


def _kind(action: argparse.Action) -> str:
    if isinstance(action, argparse._HelpAction):
        return "help"
    if isinstance(action, argparse.BooleanOptionalAction):
        return "boolean_optional"
    return "flag" if action.nargs == 0 else "value"


def flag_table() -> dict[str, Any]:
    """SGLang's command-line surface as data (see the module doc)."""
    from importlib.metadata import version

    parser = real_parser()
    flags = []
    for action in parser._actions:
        if not action.option_strings:
            raise RuntimeError(f"SGLang's parser has a positional argument {action.dest!r}; describe it")
        flags.append(
            {
                "options": list(action.option_strings),
                "dest": action.dest,
                "kind": _kind(action),
                "nargs": action.nargs,
                "type": _type_name(action),
                "choices": _choices(action),
                "required": bool(action.required),
            }
        )
    return {
        "sglang_version": version("sglang"),
        "prog": parser.prog,
        "allow_abbrev": parser.allow_abbrev,
        "prefix_chars": parser.prefix_chars,
        "mutually_exclusive": [[a.dest for a in g._group_actions] for g in parser._mutually_exclusive_groups],
        "flags": flags,
    }


def names_read_directly(package: Path) -> set[str]:
    """SGLANG_* names SGLang's code reads from os.environ itself, outside the Envs registry: the
    first argument of an env reader call (os.environ.get, os.getenv, get_bool_env_var, ...),
    os.environ[...] and `... in os.environ`. A regular expression over the source: parsing all of
    the wheel's 4,700 modules with ast takes 20 s, this takes one."""
    found: set[str] = set()
    for path in package.rglob("*.py"):
        if _SKIP_PARTS.isdisjoint(path.relative_to(package).parts):
            for match in _ENV_READ.finditer(path.read_bytes()):
                found.add(next(g for g in match.groups() if g).decode())
    return found


def environ_names() -> dict[str, Any]:
    """SGLang's env registry: Envs fields, deprecated names, and names read directly."""
    from importlib.metadata import version

    from sglang.srt import environ

    import sglang

    fields = {v.name: v for v in vars(environ.Envs).values() if isinstance(v, environ.EnvField)}
    deprecated: dict[str, str] = {}
    for name, value in fields.items():
        old = getattr(value, "deprecated_name", None)
        if old:
            deprecated[old] = f"SGLang reads it only as a fallback for {name}: use {name}"
    for old, entry in getattr(environ, "_DEPRECATED_ENVS", {}).items():
        advice = [f"use {entry.replacement}"] if getattr(entry, "replacement", None) else []
        if getattr(entry, "note", None):
            advice.append(entry.note)
        deprecated[old] = "; ".join(advice) or "SGLang ignores it (removed without replacement)"
    direct = names_read_directly(Path(sglang.__file__).parent) - set(fields) - set(deprecated)
    return {
        "sglang_version": version("sglang"),
        "names": sorted(fields),
        "deprecated": dict(sorted(deprecated.items())),
        "read_directly": sorted(direct),
    }


# --------------------------------------------------------------------------- model resolution

# Packages SGLang imports at module level once it believes CUDA is present, which cannot load on
# CPU torch: the GPU kernel packages (sglang-kernel's sgl_kernel, sgl-deep-gemm's deep_gemm,
# flashinfer) and torchvision (its wheel links CUDA torch). Each is replaced by a module whose every
# attribute is another such module: resolution imports their names and calls none of them. That
# flashinfer is importable matters: SGLang's is_flashinfer_available() is a find_spec, true on a
# lab host. pynvml: SGLang probes the GPU through NVML first; with no NVML the probe falls back
# to torch.cuda, which answers for the reported GPU.
STAND_IN_MODULES = ("sgl_kernel", "deep_gemm", "flashinfer", "torchvision", "pynvml")


class _StandInModule(types.ModuleType):
    """A module (and class base, and callable) for any name asked of it."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        child = _StandInModule(f"{self.__name__}.{name}")
        child.__path__ = []
        setattr(self, name, child)
        return child

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self

    def __mro_entries__(self, bases: tuple[Any, ...]) -> tuple[type, ...]:
        return (object,)


class _StandInFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, roots: Sequence[str]) -> None:
        self.roots = set(roots)
        self.imported: set[str] = set()

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name.split(".")[0] not in self.roots:
            return None
        self.imported.add(name)
        return importlib.machinery.ModuleSpec(name, self, is_package=True)

    def create_module(self, spec: Any) -> types.ModuleType:
        module = _StandInModule(spec.name)
        module.__path__ = []
        # transformers parses the version of an importable torchvision; the lab's torch 2.14 pairs with
        # 0.29, nothing here depends on the figure.
        module.__version__ = "0.29.0"  # type: ignore[attr-defined]
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


def report_gpu(capability: tuple[int, int], memory_mib: int, count: int, name: str, cuda: str) -> None:
    """Make torch answer for the lab's GPU before SGLang is imported: available, CUDA `cuda`,
    `capability`, `count` devices of `memory_mib`. SGLang's own probes (sglang/srt/utils/common.py:
    is_sm120_supported, is_blackwell_supported, get_device_capability, get_device_sm,
    get_nvgpu_memory_capacity's torch.cuda.mem_get_info fallback) then derive the platform from
    these answers, as on the host."""
    import torch

    total = memory_mib * 2**20
    torch.cuda.is_available = lambda: True
    torch.cuda.is_initialized = lambda: True  # get_device_sm: no NVML path
    torch.cuda.device_count = lambda: count
    torch.cuda.get_device_capability = lambda device=None: capability
    torch.cuda.get_device_name = lambda device=None: name
    torch.cuda.mem_get_info = lambda device=None: (total, total)
    torch.version.cuda = cuda


# Where SGLang's DeepSeek-V4 model code puts each layer group (sglang/srt/models/deepseek_v4.py:
# MQALayer wq_a/wq_b/wo_b, DeepseekV4DecoderLayerBase self.mlp = DeepseekV2MoE -> mlp.experts and
# mlp.shared_experts, DeepseekV4ForCausalLM lm_head; deepseek_v4_nextn.py: the MTP layer is
# model.decoder, with model.e_proj / model.h_proj and model.shared_head.head), with the layer class
# each is built from: (group, class path, prefix).
TARGET_LAYERS = (
    ("attention (wq_a)", "sglang.srt.layers.linear.ReplicatedLinear", "model.layers.2.self_attn.wq_a"),
    ("attention (wq_b)", "sglang.srt.layers.linear.ColumnParallelLinear", "model.layers.2.self_attn.wq_b"),
    ("attention (wo_b)", "sglang.srt.layers.linear.RowParallelLinear", "model.layers.2.self_attn.wo_b"),
    ("routed MoE", "sglang.srt.layers.moe.fused_moe_triton.FusedMoE", "model.layers.2.mlp.experts"),
    (
        "shared experts",
        "sglang.srt.layers.linear.MergedColumnParallelLinear",
        "model.layers.2.mlp.shared_experts.gate_up_proj",
    ),
    ("lm_head", "sglang.srt.layers.vocab_parallel_embedding.ParallelLMHead", "lm_head"),
)
DRAFT_LAYERS = (
    ("MTP attention (wq_a)", "sglang.srt.layers.linear.ReplicatedLinear", "model.decoder.self_attn.wq_a"),
    ("MTP e_proj", "sglang.srt.layers.linear.ReplicatedLinear", "model.e_proj"),
    ("MTP MoE", "sglang.srt.layers.moe.fused_moe_triton.FusedMoE", "model.decoder.mlp.experts"),
    (
        "MTP shared experts",
        "sglang.srt.layers.linear.MergedColumnParallelLinear",
        "model.decoder.mlp.shared_experts.gate_up_proj",
    ),
    ("MTP lm_head", "sglang.srt.layers.vocab_parallel_embedding.ParallelLMHead", "model.shared_head.head"),
)
RESOLVED_FIELDS = (
    "attention_backend", "prefill_attention_backend", "decode_attention_backend", "moe_runner_backend",
    "speculative_algorithm", "speculative_moe_runner_backend", "speculative_draft_model_path",
    "fp8_gemm_runner_backend", "fp4_gemm_runner_backend", "kv_cache_dtype", "page_size", "quantization",
    "disaggregation_mode", "tp_size",
)  # fmt: skip


def _layer(class_path: str) -> Any:
    """An instance of the layer class without its constructor (which needs the process groups of a
    running engine): get_quant_method dispatches on the class (isinstance) and the prefix."""
    import torch.nn as nn

    module, _, name = class_path.rpartition(".")
    cls = getattr(importlib.import_module(module), name)
    layer = cls.__new__(cls)
    nn.Module.__init__(layer)
    return layer


def _methods(quant_config: Any, layers: Sequence[tuple[str, str, str]]) -> list[dict[str, Any]]:
    out = []
    for group, class_path, prefix in layers:
        entry: dict[str, Any] = {"group": group, "layer": class_path.rpartition(".")[2], "prefix": prefix}
        try:
            method = quant_config.get_quant_method(_layer(class_path), prefix) if quant_config else None
            # None: SGLang builds the layer unquantized (its Unquantized*Method).
            entry["method"] = type(method).__name__ if method is not None else None
            entry["module"] = type(method).__module__ if method is not None else None
        except Exception as exc:  # the refusal is the answer
            entry["error"] = f"{type(exc).__name__}: {exc}"
        out.append(entry)
    return out


def resolve_one(argv: Sequence[str]) -> dict[str, Any]:
    """What SGLang decides for one command line, the way its launcher and scheduler decide it:
    prepare_server_args + ServerArgs.resolve_once (the resolution pipeline: model overrides such as
    model_overrides/deepseek_v4.py, attention and MoE backend defaults), runtime_context.publish and
    the scheduler's initialize_moe_config / initialize_fp8_gemm_config / initialize_fp4_gemm_config
    (managers/scheduler.py init_moe_gemm_config), then the loader's _get_quantization_config
    (model_loader/loader.py: HybridFp8NvFp4Config for this checkpoint) and its get_quant_method for
    each layer group at the prefixes the DeepSeek-V4 model uses; for the MTP draft the same on
    ModelConfig.from_server_args(..., is_draft_model=True) (managers/scheduler.py)."""
    from sglang.srt.arg_groups.model_override_base import model_config_of, resolved_view
    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.layers.moe.utils import (
        get_moe_runner_backend,
        get_speculative_moe_runner_backend,
        initialize_moe_config,
    )
    from sglang.srt.layers.quantization.fp4_utils import (
        get_fp4_gemm_runner_backend,
        initialize_fp4_gemm_config,
    )
    from sglang.srt.layers.quantization.fp8_utils import initialize_fp8_gemm_config
    from sglang.srt.model_loader.loader import _get_quantization_config
    from sglang.srt.runtime_context import publish, reset_context
    from sglang.srt.server_args import prepare_server_args

    printed = io.StringIO()
    answer: dict[str, Any] = {"argv": list(argv)}
    try:
        with contextlib.redirect_stderr(printed), contextlib.redirect_stdout(printed):
            reset_context()
            server_args = prepare_server_args(list(argv))
            server_args.resolve_once()
            view = resolved_view(server_args)
            answer["resolved"] = {f: _plain(getattr(view, f, None)) for f in RESOLVED_FIELDS}
            publish(server_args, role="scheduler")
            initialize_moe_config()
            initialize_fp8_gemm_config()
            initialize_fp4_gemm_config()
            answer["runtime"] = {
                "moe_runner_backend": str(get_moe_runner_backend().value),
                "speculative_moe_runner_backend": str(get_speculative_moe_runner_backend().value),
                "fp4_gemm_runner_backend": str(get_fp4_gemm_runner_backend().value),
            }
            model_config = model_config_of(server_args)
            answer["model"] = {
                "architectures": list(model_config.hf_config.architectures),
                "is_fp4_experts": bool(model_config.is_fp4_experts),
                "nvfp4_moe_meta": model_config.nvfp4_moe_meta,
            }
            quant_config = _get_quantization_config(model_config, LoadConfig())
            answer["quant_config"] = type(quant_config).__name__ if quant_config else None
            answer["layers"] = _methods(quant_config, TARGET_LAYERS)
            draft_path = answer["resolved"].get("speculative_draft_model_path")
            if answer["resolved"].get("speculative_algorithm") and draft_path:
                draft = ModelConfig.from_server_args(server_args, model_path=draft_path, is_draft_model=True)
                draft_quant = _get_quantization_config(draft, LoadConfig())
                answer["draft"] = {
                    "architectures": list(draft.hf_config.architectures),
                    "quant_config": type(draft_quant).__name__ if draft_quant else None,
                }
                answer["layers"] += _methods(draft_quant, DRAFT_LAYERS)
        answer["ok"] = True
    except SystemExit as exc:
        answer.update(ok=False, error=f"SystemExit({exc.code})")
    except Exception as exc:  # a refusal by SGLang is the answer, reported per argv
        answer.update(ok=False, error=f"{type(exc).__name__}: {exc}")
    answer["log"] = printed.getvalue()[-6000:]
    return answer


def resolve_all(request: dict[str, Any]) -> dict[str, Any]:
    """`resolve` op: report the request's GPU, stand in for the kernel packages, resolve each argv."""
    gpu = request["gpu"]
    report_gpu(
        tuple(gpu["capability"]),
        int(gpu["memory_mib"]),
        int(gpu["count"]),
        str(gpu["name"]),
        str(gpu["cuda"]),
    )
    finder = _StandInFinder(STAND_IN_MODULES)
    sys.meta_path.insert(0, finder)
    for key, value in (request.get("env") or {}).items():
        os.environ[key] = value
    answers = [resolve_one(argv) for argv in request["argvs"]]
    from importlib.metadata import version

    from sglang.srt.runtime_context import get_platform

    platform = get_platform()
    return {
        "sglang_version": version("sglang"),
        "platform": {
            "device_capability": list(platform.device_capability),
            "is_sm120": bool(platform.is_sm120),
            "is_sm100": bool(platform.is_sm100),
            "is_blackwell": bool(platform.is_blackwell),
            "has_flashinfer": bool(platform.has_flashinfer),
        },
        "stand_in_modules": sorted({n.split(".")[0] for n in finder.imported}),
        "answers": answers,
    }


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2 or args[0] not in ("parse", "flags", "environ-names", "resolve"):
        print("usage: introspect.py {parse|flags|environ-names|resolve} OUT", file=sys.stderr)
        return 2
    op, out = args
    # Dynamic choices read SGLANG_* variables (e.g. --sampling-backend): answer for a clean env.
    for key in [k for k in os.environ if k.startswith(("SGLANG_", "SGL_"))]:
        del os.environ[key]
    if op == "parse":
        request = json.load(sys.stdin)
        answer: Any = [parse(argv, request.get("fields", ())) for argv in request["argvs"]]
    elif op == "resolve":
        answer = resolve_all(json.load(sys.stdin))
    elif op == "flags":
        answer = flag_table()
    else:
        answer = environ_names()
    Path(out).write_text(json.dumps(answer))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
