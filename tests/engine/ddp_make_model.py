"""Writes a tiny random Llama (HF layout, safetensors, float32) with Stemma's byte tokenizer
for the data-parallel training test (engine/train/distributed_test.cc).

Usage: ddp_make_model.py OUT_DIR [SEED]
"""
import json
import os
import sys

import torch
import transformers


def main():
    out = sys.argv[1]
    seed = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    config = transformers.LlamaConfig(
        vocab_size=272,  # the byte tokenizer's 259 ids, padded
        hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-5,
        tie_word_embeddings=False, bos_token_id=256, eos_token_id=257, pad_token_id=258)
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(config).to(torch.float32)
    model.save_pretrained(out, safe_serialization=True)
    with open(os.path.join(out, "stemma_tokenizer.json"), "w") as f:
        json.dump({"type": "bytes"}, f)


if __name__ == "__main__":
    main()
