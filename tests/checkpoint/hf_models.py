"""Small Hugging Face models with random weights, saved by transformers' own save_pretrained,
and what transformers computes with them: the reference of tests/checkpoint/test_hf_import.cpp.

usage: hf_models.py OUT_DIR

For each model NAME, OUT_DIR/NAME/ is what save_pretrained writes (config.json and
model.safetensors, or model.safetensors.index.json and its files) and OUT_DIR/NAME.ref holds, as
text: the line "ids B T" then B*T ids; "logits B T V" then B*T*V floats (fp32, every position);
"greedy N" then the N ids of a greedy continuation (generate, do_sample=False) of the first row.
Nothing is downloaded: configs are built here, weights drawn from a seeded generator.
"""
import os
import sys

import torch
import transformers as tf
import transformers.generation.utils as gen_utils

# generate() asks whether the model is FSDP-managed, which imports torch.distributed.fsdp; on
# Debian's torch 1.13 under Python 3.11 that import fails (a dataclass default). It is not.
gen_utils.is_fsdp_managed_module = lambda module: False
tf.utils.logging.disable_progress_bar()

V, C, F, L, H, KVH, MAXT = 96, 64, 96, 2, 4, 2, 64
B, T, NEW = 2, 8, 10


def randomise(model, seed):
    # Every parameter random (biases and norms too, so that a missed bias or a norm weight
    # read as ones shows): matrices N(0, 0.08), 1-D N(0, 0.08), norms around 1.
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            r = torch.randn(p.shape, generator=g) * 0.08
            if "norm" in name or "ln_" in name:
                r = 1.0 + r
            p.copy_(r)


def llama_like(cls_cfg, **kw):
    base = dict(vocab_size=V, hidden_size=C, intermediate_size=F, num_hidden_layers=L,
                num_attention_heads=H, num_key_value_heads=KVH, max_position_embeddings=MAXT,
                rms_norm_eps=1e-5, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    base.update(kw)
    return cls_cfg(**base)


def models():
    return {
        # transformers' GPT-2: tied head, "transformer." names.
        "gpt2": (tf.GPT2LMHeadModel,
                 tf.GPT2Config(vocab_size=V, n_embd=C, n_layer=L, n_head=H, n_positions=MAXT,
                               bos_token_id=None, eos_token_id=None, resid_pdrop=0.0,
                               embd_pdrop=0.0, attn_pdrop=0.0), {}),
        # Llama 3.1-style: GQA, llama3 RoPE scaling (original context 16, so that pairs of every
        # region of the scaling occur with hd = 16), untied.
        "llama3_untied": (tf.LlamaForCausalLM,
                          llama_like(tf.LlamaConfig, rope_theta=500000.0,
                                     rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                                   "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                   "original_max_position_embeddings": 16},
                                     tie_word_embeddings=False), {}),
        # The same tied (Llama 3.2 1B), saved in bf16.
        "llama3_tied_bf16": (tf.LlamaForCausalLM,
                             llama_like(tf.LlamaConfig, rope_theta=500000.0,
                                        rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                                      "low_freq_factor": 1.0,
                                                      "high_freq_factor": 4.0,
                                                      "original_max_position_embeddings": 16},
                                        tie_word_embeddings=True), {"dtype": torch.bfloat16}),
        # Qwen2: biases on q, k, v.
        "qwen2": (tf.Qwen2ForCausalLM,
                  llama_like(tf.Qwen2Config, rope_theta=10000.0, use_sliding_window=False,
                             tie_word_embeddings=False), {}),
        # Mistral with a sliding window longer than the run, saved sharded (an index) in fp16.
        "mistral_sharded": (tf.MistralForCausalLM,
                            llama_like(tf.MistralConfig, rope_theta=10000.0, sliding_window=4096,
                                       tie_word_embeddings=False),
                            {"max_shard_size": "20KB", "dtype": torch.float16}),
    }


def write_ref(path, ids, logits, greedy):
    with open(path, "w") as f:
        f.write("ids %d %d\n" % ids.shape)
        f.write(" ".join(str(int(x)) for x in ids.flatten()) + "\n")
        f.write("logits %d %d %d\n" % logits.shape)
        f.write(" ".join("%.9g" % float(x) for x in logits.flatten()) + "\n")
        f.write("greedy %d\n" % len(greedy))
        f.write(" ".join(str(int(x)) for x in greedy) + "\n")


def main():
    out = sys.argv[1]
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1234)
    ids = torch.randint(0, V, (B, T), generator=g)
    for seed, (name, (cls, cfg, opt)) in enumerate(models().items()):
        model = cls(cfg).eval()
        randomise(model, 100 + seed)
        if model.config.tie_word_embeddings:
            model.tie_weights()
        if "dtype" in opt:
            model = model.to(opt["dtype"])
        kw = {"max_shard_size": opt["max_shard_size"]} if "max_shard_size" in opt else {}
        model.save_pretrained(os.path.join(out, name), safe_serialization=True, **kw)
        # The reference: transformers' model loaded from the directory, in fp32 (a 16-bit file's
        # values widened; its RoPE frequencies fp32, as a fresh load makes them).
        model = cls.from_pretrained(os.path.join(out, name), torch_dtype=torch.float32).eval()
        with torch.no_grad():
            logits = model(ids).logits.float()
            gen = model.generate(ids[:1], max_new_tokens=NEW, do_sample=False,
                                 pad_token_id=0, eos_token_id=None)
        write_ref(os.path.join(out, name + ".ref"), ids, logits, gen[0, T:].tolist())
    return 0


if __name__ == "__main__":
    sys.exit(main())
