#!/usr/bin/env python3
"""A tiny Llama-shaped model for the vLLM runs: seeded random weights and a byte-level
BPE tokenizer trained here on text this script writes. Nothing comes from a hub.

    make_model.py OUT_DIR [--layers 4] [--kv-heads 2] [--heads 4] [--head-dim 64] [--seed 7]

Idempotent: an OUT_DIR whose stamp file names the same parameters is left as it is.
The weights use a wide initializer range so greedy decoding is far from near-ties:
two vLLM instances then agree token for token, and a wrong KV block shows at once.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys


def corpus(seed: int, lines: int = 4000) -> list:
    """Plain English-like text for the tokenizer's training: fixed words, seeded order."""
    words = ("the a of to and in is was for on that with as by at from it this be are or an which have not "
             "cache block layer token prefill decode transfer memory engine request server model key value "
             "head attention network read write pull push lease peer remote local host device buffer "
             "quick brown fox jumps over lazy dog river mountain city ocean forest light dark time year "
             "people world number system data order first last next other new old long short high low").split()
    rnd = random.Random(seed)
    return [" ".join(rnd.choice(words) for _ in range(rnd.randint(4, 24))) + rnd.choice([".", "!", "?", ","])
            for _ in range(lines)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--intermediate", type=int, default=512)
    ap.add_argument("--vocab", type=int, default=2048)
    ap.add_argument("--max-pos", type=int, default=2048)
    ap.add_argument("--init-range", type=float, default=0.5)
    ap.add_argument("--seed", type=int, default=7)
    a = ap.parse_args()
    params = {k: v for k, v in vars(a).items() if k != "out"}
    stamp = os.path.join(a.out, "hixl-model.json")
    if os.path.exists(stamp):
        with open(stamp) as f:
            if json.load(f) == params:
                print(f"make_model: {a.out} is up to date")
                return 0

    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    os.makedirs(a.out, exist_ok=True)
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    special = ["<s>", "</s>", "<pad>"]
    trainer = trainers.BpeTrainer(vocab_size=a.vocab, special_tokens=special, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus(a.seed), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    fast.model_max_length = a.max_pos
    fast.save_pretrained(a.out)

    vocab = tok.get_vocab_size()
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=a.hidden, intermediate_size=a.intermediate,
                      num_hidden_layers=a.layers, num_attention_heads=a.heads, num_key_value_heads=a.kv_heads,
                      head_dim=a.head_dim, max_position_embeddings=a.max_pos, initializer_range=a.init_range,
                      bos_token_id=fast.bos_token_id, eos_token_id=fast.eos_token_id,
                      pad_token_id=fast.pad_token_id, tie_word_embeddings=False, torch_dtype="float32")
    torch.manual_seed(a.seed)
    model = LlamaForCausalLM(cfg)
    # The end-of-sequence token never wins a greedy step, so every run generates the
    # tokens it is asked for (ignore_eos alike on every instance).
    with torch.no_grad():
        model.lm_head.weight[fast.eos_token_id].zero_()
    model.save_pretrained(a.out, safe_serialization=True)
    with open(stamp, "w") as f:
        json.dump(params, f)
    print(f"make_model: {a.out}: {a.layers} layers, {a.heads} heads ({a.kv_heads} KV) x {a.head_dim}, "
          f"vocab {vocab}, seed {a.seed}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
