"""Makes what the fine-tuning example starts from, as a user would have it from the Hub, but
with random weights and nothing downloaded:

  OUT/model/   a Llama (grouped-query attention, untied head) saved by transformers'
               save_pretrained (config.json, model.safetensors) and its tokenizer
               (tokenizer.json + tokenizer_config.json: a byte-level BPE trained here with
               `tokenizers`, <|endoftext|> its end-of-text token);
  OUT/pairs.jsonl  prompt / completion pairs ("Q: what is 17 plus 5?" -> " A: 22.").

usage: make_model.py OUT [--pairs N]
"""
import json
import os
import random
import sys

import torch
import transformers as tf
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

tf.utils.logging.disable_progress_bar()


def pairs(n, seed):
    rng = random.Random(seed)
    ops = [("plus", lambda a, b: a + b), ("minus", lambda a, b: a - b),
           ("times", lambda a, b: a * b)]
    out = []
    for _ in range(n):
        name, f = rng.choice(ops)
        a, b = rng.randrange(0, 20), rng.randrange(0, 20)
        out.append({"prompt": f"Q: what is {a} {name} {b}?", "completion": f" A: {f(a, b)}."})
    return out


def main():
    out = sys.argv[1]
    n = int(sys.argv[sys.argv.index("--pairs") + 1]) if "--pairs" in sys.argv else 2000
    model_dir = os.path.join(out, "model")
    os.makedirs(model_dir, exist_ok=True)
    data = pairs(n, seed=1)
    with open(os.path.join(out, "pairs.jsonl"), "w") as f:
        for p in data:
            f.write(json.dumps(p) + "\n")

    # The tokenizer: GPT-2-style byte-level BPE over the pairs' text.
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, min_frequency=2,
                                  special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator([p["prompt"] + p["completion"] for p in data], trainer)
    fast = tf.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>",
                                      bos_token="<|endoftext|>")
    fast.save_pretrained(model_dir)

    # The model: a small Llama with random weights (transformers' own initialisation, seeded).
    torch.manual_seed(0)
    eot = tok.token_to_id("<|endoftext|>")
    cfg = tf.LlamaConfig(vocab_size=tok.get_vocab_size(), hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=128, rms_norm_eps=1e-5, rope_theta=10000.0,
                         tie_word_embeddings=False, bos_token_id=eot, eos_token_id=eot)
    tf.LlamaForCausalLM(cfg).save_pretrained(model_dir, safe_serialization=True)
    print(f"{model_dir}: Llama, vocabulary {cfg.vocab_size}, "
          f"{sum(1 for _ in open(os.path.join(out, 'pairs.jsonl')))} pairs in {out}/pairs.jsonl")


if __name__ == "__main__":
    main()
