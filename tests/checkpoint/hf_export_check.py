"""transformers reads what Shardwise exports: the reference of tests/checkpoint/test_hf_export*.cpp.

usage:
  hf_export_check.py tokenizer OUT.json CORPUS.txt [bytelevel]
      trains a small BPE tokenizer (PyPI's `tokenizers`, vocabulary 90 split on whitespace, or
      with `bytelevel` GPT-2's byte-level form with vocabulary 300; special token <|endoftext|>)
      on CORPUS.txt and saves it as OUT.json
  hf_export_check.py spm OUT.model CORPUS.txt
      trains a small SentencePiece BPE model (vocabulary 60, <unk> <s> </s> = 0 1 2)
  hf_export_check.py evalloss DIR TOKENS.bin T LOSS TOKENIZER.json CORPUS.txt
      transformers' mean loss over TOKENS.bin's windows of T targets (as `shardwise eval`) with
      AutoModelForCausalLM.from_pretrained(DIR) must equal LOSS within 1e-4 relative, and
      AutoTokenizer.from_pretrained(DIR) encode the corpus as TOKENIZER.json does
  hf_export_check.py check ROOT NAME...
      for each NAME: ROOT/NAME/ is an exported directory and ROOT/NAME.logits holds int32 B, T, V,
      the B*T ids, then B*V float32 logits of each row's last position as Shardwise computed
      them. AutoModelForCausalLM.from_pretrained(ROOT/NAME) must give the same logits within
      1e-4 (max |difference| / max |logit|). Where ROOT/NAME.sharded/ exists, it must hold
      several files with an index and load to the same tensors and logits. Where the export
      holds a tokenizer and ROOT/tokenizer.json and ROOT/corpus.txt exist,
      AutoTokenizer.from_pretrained(ROOT/NAME) must encode the corpus as `tokenizers` does; where
      it holds a tokenizer.model and ROOT/sp.model exists, as SentencePieceProcessor does
      (LlamaTokenizerFast where protobuf is installed, else LlamaTokenizer: transformers converts
      a .model to its fast form through protobuf).
Exits non-zero on any mismatch. Nothing is downloaded.
"""
import json
import os
import struct
import sys

import numpy as np
import torch
import transformers as tf

tf.utils.logging.set_verbosity_error()
tf.utils.logging.disable_progress_bar()
TOL = 1e-4


def fail(msg):
    print("hf_export_check: FAIL: " + msg)
    sys.exit(1)


def make_tokenizer(out, corpus, bytelevel):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE(unk_token=None))
    if bytelevel:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"],
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                      show_progress=False)
    else:
        tok.pre_tokenizer = pre_tokenizers.Whitespace()
        trainer = trainers.BpeTrainer(vocab_size=90, special_tokens=["<|endoftext|>"],
                                      show_progress=False)
    tok.train([corpus], trainer)
    tok.save(out)


def make_spm(out, corpus):
    import sentencepiece as spm
    prefix = out[:-len(".model")]
    spm.SentencePieceTrainer.train(input=corpus, model_prefix=prefix, vocab_size=60,
                                   model_type="bpe", unk_id=0, bos_id=1, eos_id=2, minloglevel=2)


def corpus_lines(root):
    text = open(os.path.join(root, "corpus.txt"), encoding="utf-8").read()
    return [l for l in text.split("\n") if l] + [text, "  two  spaces\n and a newline"]


def read_logits(path):
    b = open(path, "rb").read()
    B, T, V = struct.unpack("<3i", b[:12])
    ids = np.frombuffer(b[12:12 + 4 * B * T], dtype="<i4").reshape(B, T)
    lg = np.frombuffer(b[12 + 4 * B * T:], dtype="<f4").reshape(B, V)
    return ids, lg


def last_logits(model, ids):
    with torch.no_grad():
        out = model(torch.tensor(ids.astype(np.int64))).logits
    return out[:, -1, :].double().numpy()


def compare(name, got, want):
    rel = float(np.abs(got - want).max() / np.abs(want).max())
    print(f"{name}: max |transformers - shardwise| / max |logit| = {rel:.3g}")
    if not rel <= TOL:
        fail(f"{name}: logits differ by {rel:.3g} (> {TOL})")


def check(root, name):
    d = os.path.join(root, name)
    ids, want = read_logits(os.path.join(root, name + ".logits"))
    cfg = json.load(open(os.path.join(d, "config.json")))
    model = tf.AutoModelForCausalLM.from_pretrained(d, torch_dtype=torch.float32)
    if type(model).__name__ != cfg["architectures"][0]:
        fail(f"{name}: loaded as {type(model).__name__}, config says {cfg['architectures'][0]}")
    compare(name, last_logits(model, ids), want.astype(np.float64))

    sd = os.path.join(root, name + ".sharded")
    if os.path.isdir(sd):
        index = json.load(open(os.path.join(sd, "model.safetensors.index.json")))
        files = sorted(set(index["weight_map"].values()))
        if len(files) < 2 or os.path.exists(os.path.join(sd, "model.safetensors")):
            fail(f"{name}.sharded: expected several files and no model.safetensors, got {files}")
        from safetensors.numpy import load_file
        one = load_file(os.path.join(d, "model.safetensors"))
        many, total = {}, 0
        for f in files:
            part = load_file(os.path.join(sd, f))
            for k, v in part.items():
                if index["weight_map"].get(k) != f:
                    fail(f"{name}.sharded: {k} is in {f}, "
                         f"the index says {index['weight_map'].get(k)}")
                many[k] = v
                total += v.nbytes
        if index["metadata"]["total_size"] != total:
            fail(f"{name}.sharded: total_size {index['metadata']['total_size']} != {total}")
        if set(many) != set(one) or any(not np.array_equal(many[k], one[k]) for k in one):
            fail(f"{name}.sharded: tensors differ from the single file's")
        m2 = tf.AutoModelForCausalLM.from_pretrained(sd, torch_dtype=torch.float32)
        compare(name + ".sharded", last_logits(m2, ids), want.astype(np.float64))
        print(f"{name}.sharded: {len(files)} files, the same {len(one)} tensors")

    tj, corpus = os.path.join(root, "tokenizer.json"), os.path.join(root, "corpus.txt")
    if os.path.exists(os.path.join(d, "tokenizer.json")) and os.path.exists(tj):
        from tokenizers import Tokenizer
        orig = Tokenizer.from_file(tj)
        at = tf.AutoTokenizer.from_pretrained(d)
        text = open(corpus, encoding="utf-8").read()
        lines = [l for l in text.split("\n") if l] + [text, "a b<|endoftext|>c  d"]
        for l in lines:
            a = at.encode(l, add_special_tokens=False)
            b = orig.encode(l, add_special_tokens=False).ids
            if a != b:
                fail(f"{name}: AutoTokenizer encodes {l[:40]!r} as {a[:12]}, "
                     f"tokenizers as {b[:12]}")
        if at.eos_token != "<|endoftext|>":
            fail(f"{name}: eos_token {at.eos_token!r}")
        print(f"{name}: AutoTokenizer ({type(at).__name__}) encodes {len(lines)} texts "
              "as tokenizers")
    spm_path = os.path.join(root, "sp.model")
    if os.path.exists(os.path.join(d, "tokenizer.model")) and os.path.exists(spm_path):
        import sentencepiece as spm
        sp = spm.SentencePieceProcessor(model_file=spm_path)
        try:
            at = tf.AutoTokenizer.from_pretrained(d)
        except ImportError as e:  # no protobuf: the slow tokenizer, sentencepiece alone
            if "protobuf" not in str(e):
                raise
            at = tf.AutoTokenizer.from_pretrained(d, use_fast=False)
        lines = corpus_lines(root)
        for l in lines:
            a, b = at.encode(l, add_special_tokens=False), sp.encode(l)
            if a != b:
                fail(f"{name}: {type(at).__name__} encodes {l[:40]!r} as {a[:12]}, "
                     f"sentencepiece as {b[:12]}")
        if at.bos_token_id != 1 or at.eos_token_id != 2:
            fail(f"{name}: bos/eos ids {at.bos_token_id}/{at.eos_token_id}")
        print(f"{name}: AutoTokenizer ({type(at).__name__}) encodes {len(lines)} texts "
              "as sentencepiece")


def read_tokens(path):
    b = open(path, "rb").read()
    h = np.frombuffer(b[:1024], dtype="<i4")
    if h[0] != 20240520 or h[1] not in (1, 2):
        fail(f"{path}: not a token file (magic {h[0]}, version {h[1]})")
    dt = "<u2" if h[1] == 1 else "<i4"
    return np.frombuffer(b[1024:], dtype=dt).astype(np.int64)[: int(h[2])]


def eval_loss(d, tokens, T, want, tok_json, corpus):
    ids = read_tokens(tokens)
    model = tf.AutoModelForCausalLM.from_pretrained(d, torch_dtype=torch.float32)
    total, n = 0.0, 0
    with torch.no_grad():
        for s in range(0, len(ids) - 1, T):
            m = min(T, len(ids) - 1 - s)
            x = torch.tensor(ids[s:s + m]).unsqueeze(0)
            y = torch.tensor(ids[s + 1:s + 1 + m])
            lp = torch.log_softmax(model(x).logits[0].double(), dim=-1)
            total -= float(lp[torch.arange(m), y].sum())
            n += m
    got = total / n
    rel = abs(got - want) / abs(want)
    print(f"eval loss: transformers {got:.6f}, shardwise {want:.6f} ({n} targets), "
          f"relative {rel:.2g}")
    if not rel <= TOL:
        fail(f"losses differ by {rel:.3g} (> {TOL})")
    from tokenizers import Tokenizer
    orig, at = Tokenizer.from_file(tok_json), tf.AutoTokenizer.from_pretrained(d)
    text = open(corpus, encoding="utf-8").read()
    for l in text.split("\n")[:100] + [text]:
        if at.encode(l, add_special_tokens=False) != orig.encode(l, add_special_tokens=False).ids:
            fail(f"AutoTokenizer encodes {l[:40]!r} otherwise than tokenizers")


def main():
    if len(sys.argv) >= 4 and sys.argv[1] == "tokenizer":
        make_tokenizer(sys.argv[2], sys.argv[3], sys.argv[4:] == ["bytelevel"])
    elif len(sys.argv) >= 4 and sys.argv[1] == "spm":
        make_spm(sys.argv[2], sys.argv[3])
    elif len(sys.argv) >= 8 and sys.argv[1] == "evalloss":
        eval_loss(sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5]), sys.argv[6],
                  sys.argv[7])
    elif len(sys.argv) >= 4 and sys.argv[1] == "check":
        for name in sys.argv[3:]:
            check(sys.argv[2], name)
    else:
        fail("usage: hf_export_check.py tokenizer OUT.json CORPUS | check ROOT NAME...")


if __name__ == "__main__":
    main()
