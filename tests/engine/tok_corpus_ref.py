"""The reference ids of a real corpus for test_data_prepare_corpus.cpp.

    tok_corpus_ref.py REF_DIR

REF_DIR holds tok_ref.py's tokenizers. Writes REF_DIR/corpus.txt (Debian's fortunes and license
texts, ~5 MB, invalid UTF-8 replaced by U+FFFD; CRLF, tabs, NULs and form feeds kept as they
are) and, per tokenizer, REF_DIR/<name>.ids: the whole text's ids (int32, little-endian) from
`tokenizers` (encode, add_special_tokens=False) or `sentencepiece` (encode), then the
end-of-text id.
"""
import array
import glob
import os
import sys

import sentencepiece as spm
from tokenizers import Tokenizer

ref = sys.argv[1]
parts = []
for path in sorted(glob.glob("/usr/share/games/fortunes/*")) + sorted(
        glob.glob("/usr/share/common-licenses/*")):
    if os.path.isfile(path) and not path.endswith((".dat", ".u8")):
        with open(path, "rb") as f:
            parts.append(f.read().decode("utf-8", errors="replace"))
text = "".join(parts)
with open(os.path.join(ref, "corpus.txt"), "w", encoding="utf-8", newline="") as f:
    f.write(text)
for name, eot in [("gpt2", "<|endoftext|>"), ("llama3", "<|end_of_text|>"),
                  ("qwen2", "<|endoftext|>")]:
    tok = Tokenizer.from_file(os.path.join(ref, name + ".json"))
    ids = tok.encode(text, add_special_tokens=False).ids + [tok.token_to_id(eot)]
    with open(os.path.join(ref, name + ".ids"), "wb") as f:
        array.array("i", ids).tofile(f)
for name in ["sp_bpe", "sp_unigram"]:
    sp = spm.SentencePieceProcessor(model_file=os.path.join(ref, name + ".model"))
    with open(os.path.join(ref, name + ".ids"), "wb") as f:
        array.array("i", sp.encode(text) + [sp.eos_id()]).tofile(f)
