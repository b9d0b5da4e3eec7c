"""A TEST FIXTURE: a tiny randomly initialised causal LM, built here, nothing downloaded.

:func:`build_tiny_lm` writes a Llama-shaped model (hidden size 32 by default, 2 layers,
4 heads) with random weights, a word-level tokenizer trained on the dataset's own text
(the ``tokenizers`` library), and a ``train.jsonl`` of ``{"text": ...}`` rows that TRL's
SFT script reads as a language-modelling dataset.  The tests of the training role and
``bench/gpu_worker.py`` use it, so the CPU test and the GPU bench train the same model.

It needs torch, transformers and tokenizers (the ``train`` extra) and sets nothing in
the environment; run the training with ``HF_HUB_OFFLINE=1`` so nothing is fetched.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

#: environment for a training run that must not reach the Hugging Face Hub
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
               "TOKENIZERS_PARALLELISM": "false"}


@dataclass(frozen=True)
class TinyLm:
    """Where :func:`build_tiny_lm` put things: ``model`` (a folder for ``from_pretrained``)
    and ``data`` (a folder holding ``train.jsonl``)."""

    model: Path
    data: Path
    rows: int
    num_heads: int


def build_tiny_lm(root: str | Path, *, rows: int = 64, hidden_size: int = 32, layers: int = 2,
                  heads: int = 4, seed: int = 0, texts: list[str] | None = None) -> TinyLm:
    """Write the model, tokenizer and dataset under ``root``; return their paths.
    ``texts`` replaces the dataset's rows (and so the tokenizer's vocabulary: a few
    words give a model that can only say those words)."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    root = Path(root)
    if texts is None:
        texts = [f"def add_{i}(x): return x + {i}" for i in range(rows)]
    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    specials = ["<unk>", "<pad>", "<s>", "</s>"]
    tok.train_from_iterator(texts, trainers.WordLevelTrainer(special_tokens=specials))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", pad_token="<pad>",
                                   bos_token="<s>", eos_token="</s>")
    model_dir = root / "model"
    fast.save_pretrained(model_dir)
    cfg = LlamaConfig(vocab_size=fast.vocab_size, hidden_size=hidden_size, intermediate_size=2 * hidden_size,
                      num_hidden_layers=layers, num_attention_heads=heads,
                      num_key_value_heads=max(1, heads // 2), max_position_embeddings=64,
                      pad_token_id=fast.pad_token_id, bos_token_id=fast.bos_token_id,
                      eos_token_id=fast.eos_token_id)
    torch.manual_seed(seed)
    LlamaForCausalLM(cfg).save_pretrained(model_dir)
    data = root / "data"
    data.mkdir(parents=True, exist_ok=True)
    (data / "train.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return TinyLm(model_dir, data, len(texts), heads)
