"""GGUF files: read their header, de-quantise one into a Hugging Face folder, write one back.

GGUF is llama.cpp's single-file model format (also what Ollama and LM Studio keep): metadata
under llama.cpp's key names (the architecture's shape, the tokenizer's vocabulary, merges and
chat template), then a table of tensors, each stored as plain floats or in quantised blocks.

- ``read_header``: the metadata and tensor table, checked against the file's size, so a file
  that is not GGUF, is cut short or is corrupt gives one ``GGUFError`` before anything loads.
  Array values (the vocabulary, the merges) are kept as their length: the header of a
  50k-token model then reads in milliseconds.
- ``convert_to_folder``: transformers' own GGUF support de-quantises the weights and rebuilds
  the config and tokenizer; the result is saved as a plain safetensors model folder.
- ``write_gguf``: a transformers causal LM and its tokenizer as a GGUF file (f32 or f16) that
  llama.cpp and transformers both load, for the architectures in ``WRITERS``.

The ``gguf`` package (llama.cpp's Python library) is imported only when a file is read or
written: it is an optional dependency (``pip install gguf``).
"""

from __future__ import annotations

import copy
import json
import mmap
import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

INSTALL_GGUF = "pip install gguf"

_MAGIC = b"GGUF"
# fixed-size metadata value types of the GGUF spec: type id -> struct format
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9


class GGUFError(ValueError):
    """A GGUF file that cannot be read, loaded or written; the message names the file and why."""


def require_gguf():
    """The ``gguf`` package, or a ``GGUFError`` that says how to install it."""
    try:
        import gguf
    except ImportError:
        raise GGUFError(f"GGUF files need the gguf package, which is not installed: {INSTALL_GGUF}") from None
    return gguf


# ------------------------------------------------------------------------------------------------
# reading the header
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TensorEntry:
    name: str
    shape: tuple[int, ...]  # ggml order (fastest-moving dimension first), as the file stores it
    ggml_type: int
    offset: int  # from the start of the data section
    nbytes: int


@dataclass(frozen=True)
class GGUFHeader:
    path: Path
    version: int
    metadata: dict[str, Any]  # scalars and strings as values; arrays of strings as their length
    tensors: tuple[TensorEntry, ...]
    data_start: int

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture"))

    @property
    def parameters(self) -> int:
        """Parameters of the model the file holds.  A tied output projection is stored once (as
        the embedding), as ``model.parameters()`` counts it."""
        total = 0
        for t in self.tensors:
            n = 1
            for d in t.shape:
                n *= d
            total += n
        return total

    @property
    def tensor_types(self) -> dict[str, int]:
        """ggml type name -> number of tensors stored in it, e.g. {'Q4_1': 210, 'F32': 61}."""
        gguf = require_gguf()
        counts: dict[str, int] = {}
        for t in self.tensors:
            name = gguf.GGMLQuantizationType(t.ggml_type).name
            counts[name] = counts.get(name, 0) + 1
        return counts


def read_header(path: str | Path) -> GGUFHeader:
    """The metadata and tensor table of the GGUF file at ``path``, without reading tensor data.

    Raises ``GGUFError`` naming the file when it is not GGUF, is truncated (its tensors would
    end past the end of the file) or its header is corrupt.
    """
    path = Path(path)
    gguf = require_gguf()
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < 24:
                raise GGUFError(f"{path}: {size} bytes, too short to be a GGUF file (truncated?)")
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as blob:
                header = _parse(path, blob, gguf)
    except OSError as e:
        raise GGUFError(f"{path}: cannot be read: {e}") from None
    except struct.error:  # a read past the end of the file
        raise GGUFError(f"{path}: truncated or corrupt: the file ends inside its GGUF header ({size:,} bytes)") from None
    except (UnicodeDecodeError, ValueError, OverflowError) as e:
        if isinstance(e, GGUFError):
            raise
        raise GGUFError(f"{path}: the GGUF header is corrupt ({type(e).__name__}: {e})") from None
    end = max((header.data_start + t.offset + t.nbytes for t in header.tensors), default=header.data_start)
    if end > size:
        raise GGUFError(f"{path}: truncated: its tensors end at byte {end:,} but the file has {size:,} bytes "
                        "(an interrupted download or copy?)")
    return header


def _parse(path: Path, blob: mmap.mmap, gguf) -> GGUFHeader:
    if blob[:4] != _MAGIC:
        raise GGUFError(f"{path}: not a GGUF file (it does not start with the bytes 'GGUF')")
    version, n_tensors, n_kv = struct.unpack_from("<IQQ", blob, 4)
    if version not in (2, 3):
        raise GGUFError(f"{path}: GGUF version {version}; readable: 2 and 3")
    pos = 24

    def string() -> str:
        nonlocal pos
        (n,) = struct.unpack_from("<Q", blob, pos)
        if pos + 8 + n > len(blob):
            raise struct.error("a string runs past the end of the file")
        value = blob[pos + 8 : pos + 8 + n].decode("utf-8")
        pos += 8 + n
        return value

    def value(kind: int) -> Any:
        nonlocal pos
        if kind in _SCALARS:
            fmt = "<" + _SCALARS[kind]
            (v,) = struct.unpack_from(fmt, blob, pos)
            pos += struct.calcsize(fmt)
            return v
        if kind == _STRING:
            return string()
        if kind == _ARRAY:
            item, count = struct.unpack_from("<IQ", blob, pos)
            pos += 12
            if item in _SCALARS:  # small arrays of numbers (per-layer head counts): kept
                fmt = f"<{count}{_SCALARS[item]}"
                values = list(struct.unpack_from(fmt, blob, pos))
                pos += struct.calcsize(fmt)
                return values
            for _ in range(count):  # strings (the vocabulary, the merges): walked, kept as a count
                value(item)
            return count
        raise GGUFError(f"{path}: metadata value of unknown type {kind} (corrupt header?)")

    metadata: dict[str, Any] = {}
    for _ in range(n_kv):
        key = string()
        (kind,) = struct.unpack_from("<I", blob, pos)
        pos += 4
        metadata[key] = value(kind)
    if "general.architecture" not in metadata:
        raise GGUFError(f"{path}: no general.architecture in its metadata")
    tensors = []
    for _ in range(n_tensors):
        name = string()
        (ndim,) = struct.unpack_from("<I", blob, pos)
        shape = struct.unpack_from(f"<{ndim}Q", blob, pos + 4)
        ggml_type, offset = struct.unpack_from("<IQ", blob, pos + 4 + 8 * ndim)
        pos += 4 + 8 * ndim + 12
        try:
            block, block_bytes = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(ggml_type)]
        except (ValueError, KeyError):
            raise GGUFError(f"{path}: tensor {name!r} has ggml type {ggml_type}, unknown to the installed "
                            f"gguf package (corrupt, or newer than it: pip install -U gguf)") from None
        n = 1
        for d in shape:
            n *= d
        tensors.append(TensorEntry(name, tuple(shape), ggml_type, offset, n // block * block_bytes))
    alignment = int(metadata.get("general.alignment", 32))
    data_start = (pos + alignment - 1) // alignment * alignment
    return GGUFHeader(path, version, metadata, tuple(tensors), data_start)


# ------------------------------------------------------------------------------------------------
# GGUF -> Hugging Face folder
# ------------------------------------------------------------------------------------------------


def loadable(architecture: str) -> tuple[bool, list[str]]:
    """(whether the installed transformers loads a GGUF of ``architecture``, the ones it loads).

    Read from transformers' own tables (its older per-architecture reader and its newer
    conversion mappings), with the renames that reader applies (``qwen2moe`` -> ``qwen2_moe``);
    when those tables cannot be found the answer is yes, and loading decides.
    """
    try:
        from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES
    except ImportError:
        return True, []
    archs = set(GGUF_SUPPORTED_ARCHITECTURES) - {"general", "tokenizer"}  # key groups of its table, not models
    try:
        from transformers.integrations.gguf import GGUF_ARCHS

        archs |= set(GGUF_ARCHS)
    except ImportError:
        pass
    names = {architecture, architecture.replace("-", "_"), re.sub(r"moe$", "_moe", architecture)}
    if "t5" in architecture:
        names.add("t5")
    return bool(names & archs), sorted(archs)


def convert_to_folder(path: str | Path, out: str | Path, dtype: torch.dtype | str) -> None:
    """De-quantise the GGUF file at ``path`` into ``dtype`` and save model and tokenizer (with its
    chat template) to the folder ``out`` in Hugging Face format (safetensors).

    transformers marks a model loaded from GGUF as quantised (``config.quantization_config``,
    ``model.hf_quantizer``) even though its weights are plain tensors by then, and
    ``save_pretrained`` refuses such a model; so the architecture is rebuilt from the config
    without that mark (on the meta device: no second copy of the weights) and takes over the
    loaded tensors.  Raises ``GGUFError`` when transformers cannot load the file.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(path).resolve()
    header = read_header(path)  # a clear error for a broken file before transformers reads it
    try:  # an absolute gguf_file: transformers would otherwise look for the name in the current directory first
        tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=str(path))
        loaded = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=str(path), dtype=dtype)
    except Exception as e:  # noqa: BLE001 - transformers raises many kinds; all mean "cannot load this file"
        raise GGUFError(f"{path}: transformers cannot load this GGUF file (architecture {header.architecture!r}): "
                        f"{type(e).__name__}: {e}") from e
    config = copy.deepcopy(loaded.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    with torch.device("meta"):
        plain = AutoModelForCausalLM.from_config(config, dtype=loaded.dtype)
    plain.load_state_dict(loaded.state_dict(), assign=True)
    plain.tie_weights()
    plain.generation_config = loaded.generation_config
    plain.save_pretrained(str(out))
    tok.save_pretrained(str(out))


# ------------------------------------------------------------------------------------------------
# Hugging Face model -> GGUF
# ------------------------------------------------------------------------------------------------

# Hugging Face tensor names of a llama-style decoder -> GGUF names (llama.cpp's standard names)
_TENSOR_NAMES: tuple[tuple[str, str], ...] = (
    (r"model\.embed_tokens\.(weight)", r"token_embd.\1"),
    (r"model\.norm\.(weight)", r"output_norm.\1"),
    (r"lm_head\.(weight)", r"output.\1"),
    (r"model\.layers\.(\d+)\.input_layernorm\.(weight)", r"blk.\1.attn_norm.\2"),
    (r"model\.layers\.(\d+)\.post_attention_layernorm\.(weight)", r"blk.\1.ffn_norm.\2"),
    (r"model\.layers\.(\d+)\.self_attn\.q_proj\.(weight|bias)", r"blk.\1.attn_q.\2"),
    (r"model\.layers\.(\d+)\.self_attn\.k_proj\.(weight|bias)", r"blk.\1.attn_k.\2"),
    (r"model\.layers\.(\d+)\.self_attn\.v_proj\.(weight|bias)", r"blk.\1.attn_v.\2"),
    (r"model\.layers\.(\d+)\.self_attn\.o_proj\.(weight)", r"blk.\1.attn_output.\2"),
    (r"model\.layers\.(\d+)\.mlp\.gate_proj\.(weight)", r"blk.\1.ffn_gate.\2"),
    (r"model\.layers\.(\d+)\.mlp\.up_proj\.(weight)", r"blk.\1.ffn_up.\2"),
    (r"model\.layers\.(\d+)\.mlp\.down_proj\.(weight)", r"blk.\1.ffn_down.\2"),
)


def gguf_tensor_name(hf_name: str) -> str | None:
    for pattern, repl in _TENSOR_NAMES:
        if re.fullmatch(pattern, hf_name):
            return re.sub(pattern, repl, hf_name)
    return None


def _rope(config) -> tuple[float, str]:
    """(rope theta, rope type) of a config, in the transformers 5 layout or the older one."""
    params = getattr(config, "rope_parameters", None)
    if params:
        return float(params["rope_theta"]), str(params.get("rope_type", "default"))
    scaling = getattr(config, "rope_scaling", None) or {}
    return float(config.rope_theta), str(scaling.get("rope_type", scaling.get("type", "default")))


def _head_dim(config) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def _to_interleaved(w: torch.Tensor, heads: int) -> torch.Tensor:
    """Reorder the rows of a llama Q or K projection (or bias) from Hugging Face's rotary layout
    to llama.cpp's.

    Hugging Face rotates the two halves of each head's dimensions (``rotate_half``: dimension i
    pairs with i + d/2); llama.cpp's llama graph rotates adjacent pairs (2i with 2i+1).  Within
    each head, row i of the first half goes to 2i and row i of the second half to 2i+1; the
    GGUF readers (llama.cpp, transformers) apply the inverse.
    """
    rows = w.shape[0]
    d = rows // heads
    return w.reshape(heads, 2, d // 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def _check_llama(config) -> None:
    rope_theta, rope_type = _rope(config)
    if rope_type != "default":
        raise GGUFError(f"rope type {rope_type!r}: only the default rotary embedding is written")
    for flag in ("attention_bias", "mlp_bias"):
        if getattr(config, flag, False):
            raise GGUFError(f"{flag}: true: a llama model with biases cannot be written (GGUF readers would drop them)")


def _check_qwen2(config) -> None:
    _, rope_type = _rope(config)
    if rope_type != "default":
        raise GGUFError(f"rope type {rope_type!r}: only the default rotary embedding is written")
    if getattr(config, "use_sliding_window", False):
        raise GGUFError("use_sliding_window: true cannot be written (the qwen2 GGUF keys have no sliding window)")
    if _head_dim(config) * config.num_attention_heads != config.hidden_size:
        # the qwen2 GGUF readers derive the head size from hidden_size / heads
        raise GGUFError(f"head_dim {_head_dim(config)} != hidden_size / num_attention_heads: not expressible in qwen2 GGUF")


@dataclass(frozen=True)
class ArchWriter:
    """How one architecture goes into GGUF: its config checks and whether Q/K rows are reordered."""

    check: Callable[[Any], None]
    interleave_qk: bool  # llama: yes (llama.cpp's llama rotates adjacent pairs); qwen2: no (NEOX style)


WRITERS: dict[str, ArchWriter] = {
    "llama": ArchWriter(_check_llama, interleave_qk=True),
    "qwen2": ArchWriter(_check_qwen2, interleave_qk=False),
}

GGUF_DTYPES = ("f16", "f32")


def write_gguf(model, tokenizer, path: str | Path, dtype: str = "f16", name: str | None = None,
               tokenizer_pre: str | None = None) -> Path:
    """Write ``model`` (a transformers llama or qwen2 causal LM) and ``tokenizer`` (a byte-level
    BPE fast tokenizer) to the GGUF file ``path``; returns the path.

    ``dtype``: ``f32`` (exact) or ``f16`` (matrices in half precision, norms and biases in f32,
    as llama.cpp's converter does).  ``tokenizer_pre``: llama.cpp's pre-tokenizer name
    (``tokenizer.ggml.pre``); by default it is derived from the tokenizer (``pre_tokenizer_name``).
    The file is written next to ``path`` and renamed into place when complete.
    """
    gguf = require_gguf()
    if dtype not in GGUF_DTYPES:
        raise GGUFError(f"GGUF dtype {dtype!r}; valid: {list(GGUF_DTYPES)}")
    config = model.config
    arch = config.model_type
    if arch not in WRITERS:
        raise GGUFError(f"architecture {arch!r} cannot be written as GGUF; supported: {sorted(WRITERS)}")
    writer_spec = WRITERS[arch]
    writer_spec.check(config)
    tensors = _gguf_tensors(model, writer_spec, dtype)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = str(path.with_name(f".{path.name}.{os.getpid()}.tmp"))  # opened by the writer: the usual file mode
    try:
        w = gguf.GGUFWriter(tmp, arch)
        w.add_name(name or getattr(config, "_name_or_path", "") or arch)
        w.add_file_type(gguf.LlamaFileType.ALL_F32 if dtype == "f32" else gguf.LlamaFileType.MOSTLY_F16)
        rope_theta, _ = _rope(config)
        w.add_context_length(config.max_position_embeddings)
        w.add_embedding_length(config.hidden_size)
        w.add_block_count(config.num_hidden_layers)
        w.add_feed_forward_length(config.intermediate_size)
        w.add_head_count(config.num_attention_heads)
        w.add_head_count_kv(config.num_key_value_heads or config.num_attention_heads)
        w.add_layer_norm_rms_eps(config.rms_norm_eps)
        w.add_rope_freq_base(rope_theta)
        w.add_rope_dimension_count(_head_dim(config))
        if arch == "llama":  # llama.cpp's converter states the head size too (it may differ from hidden / heads)
            w.add_key_length(_head_dim(config))
            w.add_value_length(_head_dim(config))
        w.add_vocab_size(config.vocab_size)
        _add_tokenizer(w, gguf, tokenizer, config.vocab_size, tokenizer_pre)
        for gguf_name, array in tensors:
            w.add_tensor(gguf_name, array)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def _gguf_tensors(model, spec: ArchWriter, dtype: str) -> list[tuple[str, Any]]:
    """(GGUF name, numpy array) of every weight, in the order of the model's state dict."""
    config = model.config
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads or config.num_attention_heads
    tied = bool(getattr(config, "tie_word_embeddings", False))
    out = []
    for hf_name, t in model.state_dict().items():
        if tied and hf_name == "lm_head.weight":
            continue  # llama.cpp reuses the embedding when there is no output tensor (and transformers ties them)
        gguf_name = gguf_tensor_name(hf_name)
        if gguf_name is None:
            raise GGUFError(f"tensor {hf_name!r} has no GGUF name for {config.model_type!r}; the model has parts "
                            "this writer does not know")
        t = t.detach().to("cpu", torch.float32)
        if spec.interleave_qk and ".attn_q." in gguf_name:
            t = _to_interleaved(t, heads)
        elif spec.interleave_qk and ".attn_k." in gguf_name:
            t = _to_interleaved(t, kv_heads)
        # f16 files keep vectors (norms, biases) in f32, as llama.cpp's converter does
        if dtype == "f16" and t.dim() > 1:
            t = t.to(torch.float16)
        out.append((gguf_name, t.contiguous().numpy()))
    return out


# ------------------------------------------------------------------------------------------------
# the tokenizer
# ------------------------------------------------------------------------------------------------


def pre_tokenizer_name(tokenizer) -> str:
    """llama.cpp's name for how ``tokenizer`` splits text before BPE (``tokenizer.ggml.pre``).

    Recognised: digits one per token then the GPT-2 split (``smollm``, also the embedded
    model's), the GPT-2 split alone (``gpt2``) and Qwen2's split (``qwen2``); anything else is
    written as ``default``, which llama.cpp reads with a generic split.
    """
    spec = json.loads(tokenizer.backend_tokenizer.to_str()).get("pre_tokenizer") or {}
    steps = spec.get("pretokenizers", []) if spec.get("type") == "Sequence" else [spec]
    kinds = [s.get("type") for s in steps]
    if kinds == ["Digits", "ByteLevel"] and steps[0].get("individual_digits") and steps[1].get("use_regex", True):
        return "smollm"
    if kinds == ["ByteLevel"] and steps[0].get("use_regex", True):
        return "gpt2"
    if kinds == ["Split", "ByteLevel"]:
        from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

        if steps[0].get("pattern", {}).get("Regex") == PRETOKENIZE_REGEX:
            return "qwen2"
    return "default"


def _add_tokenizer(w, gguf, tokenizer, vocab_size: int, pre: str | None) -> None:
    """The vocabulary, merges, token types, special ids and chat template, under llama.cpp's keys."""
    if not getattr(tokenizer, "is_fast", False) or getattr(tokenizer, "backend_tokenizer", None) is None:
        raise GGUFError(f"tokenizer {type(tokenizer).__name__}: only fast (tokenizers) BPE tokenizers can be written")
    spec = json.loads(tokenizer.backend_tokenizer.to_str())
    bpe = spec.get("model") or {}
    if bpe.get("type") != "BPE" or "ByteLevel" not in json.dumps(spec.get("decoder")):
        raise GGUFError(f"tokenizer model {bpe.get('type')!r}: only byte-level BPE tokenizers (GGUF tokenizer model "
                        "'gpt2': GPT-2, Llama 3, Qwen2, SmolLM2, the embedded model) can be written")
    special = {t["id"] for t in spec.get("added_tokens", []) if t.get("special")}
    added = {t["id"] for t in spec.get("added_tokens", [])}
    by_id = {i: t for t, i in tokenizer.get_vocab().items()}  # added tokens included
    beyond = sorted(i for i in by_id if i >= vocab_size)
    if any(i not in added for i in beyond):
        raise GGUFError(f"the tokenizer's vocabulary has token id {beyond[-1]} but the model's has {vocab_size} rows")
    # an added token past the embedding (e.g. a default one a tokenizer class adds) can never be
    # fed to the model: left out, as the model's own vocabulary has no row for it
    by_id = {i: t for i, t in by_id.items() if i < vocab_size}
    tokens, types = [], []
    for i in range(vocab_size):
        if i not in by_id:  # embedding rows beyond the tokenizer (padded vocabularies)
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
            continue
        tokens.append(by_id[i])
        types.append(gguf.TokenType.CONTROL if i in special else
                     gguf.TokenType.USER_DEFINED if i in added else gguf.TokenType.NORMAL)
    merges = [m if isinstance(m, str) else " ".join(m) for m in bpe.get("merges", [])]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre or pre_tokenizer_name(tokenizer))
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    ids = tokenizer("a", add_special_tokens=True)["input_ids"]
    for attr, add in (("bos_token_id", w.add_bos_token_id), ("eos_token_id", w.add_eos_token_id),
                      ("unk_token_id", w.add_unk_token_id), ("pad_token_id", w.add_pad_token_id)):
        value = getattr(tokenizer, attr, None)
        if value is not None and int(value) < vocab_size:
            add(int(value))
    bos, eos = tokenizer.bos_token_id, tokenizer.eos_token_id
    w.add_add_bos_token(bos is not None and ids[:1] == [bos])
    w.add_add_eos_token(eos is not None and len(ids) > 1 and ids[-1:] == [eos])
    template = tokenizer.chat_template
    if isinstance(template, dict):  # several named templates: llama.cpp reads the default one
        template = template.get("default")
    if template:
        w.add_chat_template(template)
