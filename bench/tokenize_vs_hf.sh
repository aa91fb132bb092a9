#!/usr/bin/env bash
# `shardwise data prepare --tokenizer` against the reference packages' own batch encoders, on
# the same corpus, tokenizer and number of threads:
#   byte-level BPE   tokenizers' Tokenizer.encode_batch (RAYON_NUM_THREADS = THREADS), on a
#                    Llama-3 style tokenizer.json (Split regex + ByteLevel, 32,000 ids) trained
#                    here on the corpus;
#   SentencePiece    sentencepiece's SentencePieceProcessor.encode(list, num_threads=THREADS),
#                    on a BPE .model (8,000 ids, byte fallback) trained here.
# The corpus: Debian's fortunes, licenses and package changelogs (tens of MB of English prose,
# names, code and dates), cut to MB megabytes (repeated if they are fewer). The reference encoders get it as
# pieces of a line or two (>= 64 bytes, cut after a newline: their fastest batch on this corpus,
# against 256 B: 1.4x, 4 KB: 1.8x, 64 KB: 3.2x slower) held in memory, the time of the batch
# call alone; shardwise reads it from one file, writes the token file, and reports its own
# tokens/s over all of that (its timer starts after the tokenizer is loaded and stops before the
# output files are renamed into place, which favours it slightly). Each side
# runs REPS times (3); the best run of each is printed, and the ratio shardwise / reference.
#   bench/tokenize_vs_hf.sh [MB (32)] [THREADS (nproc)]
# Wrap timed runs in bench/quiet.sh on a shared machine. BUILD_DIR (build) holds
# tools/shardwise; .venv (scripts/setup.sh) has tokenizers and sentencepiece.
case "${1:-}" in -h | --help) awk 'NR > 1 && /^#/ {sub(/^# ?/, ""); print; next} NR > 1 {exit}' "$0"; exit 0 ;; esac
set -euo pipefail
cd "$(dirname "$0")/.."
mb=${1:-32}
threads=${2:-$(nproc)}
reps=${REPS:-3}
bin=${BUILD_DIR:-build}/tools/shardwise
py=.venv/bin/python
[ -x "$bin" ] || { echo "tokenize_vs_hf: $bin not built" >&2; exit 1; }
[ -x "$py" ] || { echo "tokenize_vs_hf: $py missing (scripts/setup.sh)" >&2; exit 1; }
work=$(mktemp -d /tmp/sw_tokbench.XXXXXX)
trap 'rm -rf "$work"' EXIT

# The corpus.
{
  for f in /usr/share/games/fortunes/*; do
    case "$f" in *.dat | *.u8) ;; *) [ -f "$f" ] && cat "$f" ;; esac
  done
  cat /usr/share/common-licenses/* 2>/dev/null || true
  for f in /usr/share/doc/*/changelog*.gz; do zcat "$f" 2>/dev/null || true; done
} > "$work/base.txt"
bytes=$((mb * 1000 * 1000))
while [ "$(stat -c %s "$work/corpus.txt" 2>/dev/null || echo 0)" -lt "$bytes" ]; do
  cat "$work/base.txt" >> "$work/corpus.txt"
done
truncate -s "$bytes" "$work/corpus.txt"
# Valid UTF-8 (the reference encoders take str: bytes that are not UTF-8 become U+FFFD), cut
# back to the last newline.
"$py" - "$work/corpus.txt" <<'EOF'
import sys
p = sys.argv[1]
b = open(p, "rb").read()
b = b[: b.rfind(b"\n") + 1].decode("utf-8", errors="replace").encode("utf-8")
open(p, "wb").write(b)
EOF
echo "corpus: $(stat -c %s "$work/corpus.txt") bytes; threads $threads; $(nproc) cores; load $(cut -d' ' -f1-3 /proc/loadavg)"

# The tokenizers, trained on the first 8 MB of the corpus.
RAYON_NUM_THREADS=$threads "$py" - "$work" <<'EOF'
import os, sys
import sentencepiece as spm
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
w = sys.argv[1]
text = open(os.path.join(w, "base.txt"), encoding="utf-8", errors="replace").read()[:8_000_000]
lines = text.splitlines()
pat = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
       r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
tok = Tokenizer(models.BPE(ignore_merges=True))
tok.pre_tokenizer = pre_tokenizers.Sequence([
    pre_tokenizers.Split(Regex(pat), behavior="isolated"),
    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
tok.decoder = decoders.ByteLevel()
tok.train_from_iterator(lines, trainers.BpeTrainer(
    vocab_size=32000, special_tokens=["<|begin_of_text|>", "<|end_of_text|>"],
    initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
tok.save(os.path.join(w, "tokenizer.json"))
with open(os.path.join(w, "sp_train.txt"), "w", encoding="utf-8") as f:
    f.write("\n".join(lines[:200000]))
spm.SentencePieceTrainer.train(
    input=os.path.join(w, "sp_train.txt"), model_prefix=os.path.join(w, "sp"), vocab_size=8000,
    model_type="bpe", byte_fallback=True, character_coverage=1.0, minloglevel=2,
    num_threads=os.cpu_count())
EOF

# The reference encoders: best of REPS, after one warm-up on the first pieces.
ref() {  # ref json|sp -> "tokens seconds"
  RAYON_NUM_THREADS=$threads "$py" - "$work" "$1" "$threads" "$reps" <<'EOF'
import os, sys, time
w, kind, threads, reps = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
text = open(os.path.join(w, "corpus.txt"), encoding="utf-8", newline="").read()
pieces, start = [], 0
while start < len(text):
    end = text.find("\n", start + 64)
    end = len(text) if end < 0 else end + 1
    pieces.append(text[start:end])
    start = end
if kind == "json":
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(os.path.join(w, "tokenizer.json"))
    run = lambda ps: tok.encode_batch(ps, add_special_tokens=False)
    count = lambda enc: sum(len(e.ids) for e in enc)
else:
    import sentencepiece as spm
    sp = spm.SentencePieceProcessor(model_file=os.path.join(w, "sp.model"))
    run = lambda ps: sp.encode(ps, num_threads=threads)
    count = lambda enc: sum(len(e) for e in enc)
run(pieces[:32])
best = None
for _ in range(reps):
    t = time.perf_counter()
    enc = run(pieces)
    s = time.perf_counter() - t
    best = s if best is None else min(best, s)
print(count(enc), best)
EOF
}
ours() {  # ours FILE -> "tokens seconds" (its own timer: read, encode, write)
  local line tokens=0
  "$bin" data prepare "$work/corpus.txt" --tokenizer "$1" --out "$work/warm.bin" \
      --threads "$threads" --quiet >/dev/null
  : > "$work/times"
  for _ in $(seq "$reps"); do
    line=$("$bin" data prepare "$work/corpus.txt" --tokenizer "$1" --out "$work/out.bin" \
           --threads "$threads" --quiet | grep 'tokens in')
    tokens=$(echo "$line" | awk '{print $1}')
    echo "$line" | awk '{print $4}' >> "$work/times"
  done
  echo "$tokens $(sort -g "$work/times" | head -1)"
}
report() {  # report NAME "tokens seconds" "tokens seconds"
  echo "$1" "$2" "$3" | awk '{
    r = $2 / $3; o = $4 / $5;
    printf "%-14s reference %10d tokens %7.3f s %6.2f M tok/s | shardwise %10d tokens %7.3f s %6.2f M tok/s | ratio %.2f\n",
           $1, $2, $3, r / 1e6, $4, $5, o / 1e6, o / r }'
}
report "bpe-32k" "$(ref json)" "$(ours "$work/tokenizer.json")"
report "sp-bpe-8k" "$(ref sp)" "$(ours "$work/sp.model")"
