"""Reference tokenizers for test_tokenizer.cpp, made at test time (nothing downloaded).

    tok_ref.py OUT_DIR

Trains small tokenizers in OUT_DIR with PyPI's `tokenizers` (GPT-2 style ByteLevel, with and
without a prefix space; Llama-3 style Split regex + ByteLevel(use_regex=False) with
ignore_merges, special and added tokens, and the same with half its merges dropped; Qwen2 style
with NFC) and `sentencepiece` (Llama-2
style BPE with byte fallback; unigram with its default normalization), on a corpus of Debian's
license texts plus Unicode lines, then encodes the test texts with each and writes
OUT_DIR/ref.json:
  {"texts": [...], "document": FILE, "tokenizers": [{"name", "file", "vocab", "bos", "eot",
   "ids": [[...] per text], "decoded": [... per text], "document_ids": [...]}]}
`document` is one larger text (the corpus and the test texts, ~300 KB) encoded whole, for the
chunked encoder of `shardwise data prepare`.
"""
import glob
import json
import os
import sys

import sentencepiece as spm
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
from tokenizers import processors, trainers

LLAMA3_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
             r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
            r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

UNICODE_LINES = [
    "日本語のテキストと中文文本，还有한국어 문장。",
    "Emoji: 😀🎉👍🏽 family 👨‍👩‍👧 flags 🇫🇷🇯🇵",
    "Combining: e\u0301 a\u0308 n\u0303 (decomposed) vs é ä ñ (composed); A\u030a\u0301",
    "Arabic: مرحبا بالعالم، كيف حالك؟ Hebrew: שלום עולם",
    "Greek Ελληνικά, Cyrillic Привет мир, Devanagari हिन्दी, Thai ภาษาไทย",
    "Math ∑∫∂ √2 ≈ 1.41421356, ½ ⅓ ²³, full-width ＡＢＣ１２３",
]

TEXTS = [
    "Hello world",
    "",
    " ",
    "hello",
    "  leading spaces and trailing   ",
    "Whitespace runs:    four, \t\ttabs, \n\nnewlines\n\n\n  and \r\n CRLF \u00a0nbsp\u3000ideographic \u0085nel",
    "Digits 1234567890 12 345 6789 3.14159 -42 1,000,000 2024-05-20",
    "Contractions: I'm you're we've they'll she'd it's don't CAN'T I'M YOU'RE",
    "Code: for (int i = 0; i < n; i++) { x[i] += y[i] * 2; } // done\n\tif x == 3: return",
    "Special <|endoftext|> in the middle<|endoftext|>and at the end <|endoftext|>",
    "<|begin_of_text|>Llama's<|end_of_text|> <|reserved_special_token_0|>x <mask> y",
    "chat <|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\n",
    "added words: hello world, helloworld, hello  world",
    "Punctuation!!! ??? ... --- ((( ))) \"quotes\" 'single' `back` @#$%^&*",
    "Mixed: naïve café résumé Zürich Øresund Åland façade coöperate",
    "Odd spaces: a\u0085b a\u001cb a\u001fb a\u180eb a\u200bb a\ufeffb a\u2028b a\u00a0 b "
    "a \u0085 b a\u0085\u0085 b\u3000\u3000c\u2029\nd\u000b\u000ce",
] + UNICODE_LINES + ["\n".join(UNICODE_LINES) + "\n\n  \t end"]


def corpus_lines():
    lines = []
    for path in sorted(glob.glob("/usr/share/common-licenses/*")):
        if os.path.isfile(path):
            with open(path, encoding="utf-8", errors="replace") as f:
                lines.extend(f.read().splitlines())
    lines.extend(UNICODE_LINES * 20)
    lines.extend(TEXTS * 5)
    return lines


def byte_level_trainer(vocab, specials):
    return trainers.BpeTrainer(vocab_size=vocab, min_frequency=2, special_tokens=specials,
                               initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                               show_progress=False)


def hf_tokenizers(out, lines):
    made = []
    # GPT-2: ByteLevel with its own regex.
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.train_from_iterator(lines, byte_level_trainer(800, ["<|endoftext|>"]))
    path = os.path.join(out, "gpt2.json")
    tok.save(path)
    made.append(("gpt2", path, tok))
    # The same with a prefix space on every piece.
    tok2 = Tokenizer.from_file(path)
    tok2.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    path = os.path.join(out, "gpt2_prefix.json")
    tok2.save(path)
    made.append(("gpt2_prefix", path, tok2))
    # Llama 3: Split(regex, isolated) + ByteLevel(use_regex=False), ignore_merges, specials,
    # a non-special added token (matched after normalization) and an lstrip one.
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_RE), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>"]
    tok.train_from_iterator(lines, byte_level_trainer(1000, specials))
    tok.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", 0)])
    tok.add_tokens(["hello world"])
    tok.add_special_tokens([AddedToken("<mask>", lstrip=True, rstrip=False, special=True)])
    path = os.path.join(out, "llama3.json")
    tok.save(path)
    made.append(("llama3", path, tok))
    # Llama 3 with the later half of its merges dropped (the vocabulary kept): words that are
    # vocabulary entries still encode to one id through ignore_merges alone.
    with open(path, encoding="utf-8") as f:
        j = json.load(f)
    j["model"]["merges"] = j["model"]["merges"][: len(j["model"]["merges"]) // 2]
    path = os.path.join(out, "llama3_pruned.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(j, f, ensure_ascii=False)
    made.append(("llama3_pruned", path, Tokenizer.from_file(path)))
    # Qwen2: NFC, its regex (single digits), ByteLevel(use_regex=False).
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_RE), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(lines, byte_level_trainer(
        900, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]))
    path = os.path.join(out, "qwen2.json")
    tok.save(path)
    made.append(("qwen2", path, tok))
    return made


def sp_models(out, lines):
    corpus = os.path.join(out, "sp_corpus.txt")
    with open(corpus, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    made = []
    # Llama 2 style: BPE, byte fallback, identity normalization, digits split, whitespace kept.
    spm.SentencePieceTrainer.train(
        input=corpus, model_prefix=os.path.join(out, "sp_bpe"), vocab_size=700,
        model_type="bpe", character_coverage=1.0, byte_fallback=True, split_digits=True,
        normalization_rule_name="identity", remove_extra_whitespaces=False,
        allow_whitespace_only_pieces=True, minloglevel=2)
    made.append(("sp_bpe", os.path.join(out, "sp_bpe.model")))
    # Unigram with the default (nmt_nfkc) normalization.
    spm.SentencePieceTrainer.train(
        input=corpus, model_prefix=os.path.join(out, "sp_unigram"), vocab_size=700,
        model_type="unigram", character_coverage=0.9995, minloglevel=2)
    made.append(("sp_unigram", os.path.join(out, "sp_unigram.model")))
    return made


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    lines = corpus_lines()
    document = "\n".join(lines[:4000]) + "\n" + "\n".join(TEXTS)
    doc_path = os.path.join(out, "document.txt")
    with open(doc_path, "w", encoding="utf-8") as f:
        f.write(document)
    result = {"texts": TEXTS, "document": doc_path, "tokenizers": []}
    for name, path, tok in hf_tokenizers(out, lines):
        vocab = tok.get_vocab_size(with_added_tokens=True)
        eot = next((tok.token_to_id(t) for t in ["<|endoftext|>", "<|end_of_text|>"]
                    if tok.token_to_id(t) is not None), -1)
        bos = tok.token_to_id("<|begin_of_text|>") if name.startswith("llama3") else -1
        ids = [tok.encode(t, add_special_tokens=False).ids for t in TEXTS]
        result["tokenizers"].append({
            "name": name, "file": path, "vocab": vocab, "bos": bos, "eot": eot, "ids": ids,
            "decoded": [tok.decode(i, skip_special_tokens=False) for i in ids],
            "document_ids": tok.encode(document, add_special_tokens=False).ids})
    for name, path in sp_models(out, lines):
        sp = spm.SentencePieceProcessor(model_file=path)
        ids = [sp.encode(t) for t in TEXTS]
        result["tokenizers"].append({
            "name": name, "file": path, "vocab": sp.get_piece_size(), "bos": sp.bos_id(),
            "eot": sp.eos_id(), "ids": ids, "decoded": [sp.decode(i) for i in ids],
            "document_ids": sp.encode(document)})
    with open(os.path.join(out, "ref.json"), "w", encoding="utf-8") as f:
        json.dump(result, f, ensure_ascii=False)


if __name__ == "__main__":
    main()
