# Sourced by the mpirun test scripts (tests/engine/mpi_common.sh, tests/twohost/twohost.sh),
# which set sw (the binary), work (a temporary directory) and fail MSG.
# prepare_text LINES: LINES lines of text prepared into $work/train.bin and $work/val.bin.
prepare_text() {
  local i
  for i in $(seq 1 "$1"); do echo "line $i: the quick brown fox jumps over $((i * 7 % 13)) lazy dogs"; done >"$work/text.txt"
  "$sw" data prepare "$work/text.txt" --out "$work/train.bin" --val "$work/val.bin" >/dev/null ||
    fail "data prepare"
}
# tiny_gpt_config FILE: the 2-layer GPT the parity runs train (8 steps, run_dir $work/r1).
tiny_gpt_config() {
  cat >"$1" <<JSON
{
  "model": {"type": "gpt2", "vocab_size": 256, "n_layer": 2, "n_head": 2, "d_model": 32,
            "seq_len": 16},
  "data": {"train": "$work/train.bin", "val": "$work/val.bin"},
  "train_micro_batch_size_per_gpu": 4, "train_steps": 8, "eval_every_steps": 4,
  "eval_batches": 3, "log_every_steps": 4, "threads": 1,
  "optimizer": {"params": {"lr": 0.003}}, "gradient_clipping": 1.0,
  "run_dir": "$work/r1"
}
JSON
}
