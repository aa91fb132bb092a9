# Sourced by the engine's mpirun scripts (mpi_train.sh, mpi_resume.sh):
#   source mpi_common.sh NAME SHARDWISE MPIEXEC [mpirun flags...]
# sets sw (the binary), mpirun (an array: MPIEXEC and its flags), work (a temporary directory
# removed at exit) and fail MSG (prints "NAME: FAIL: MSG", exits 1).
# prepare_text LINES writes LINES lines of text and prepares $work/train.bin and $work/val.bin.
sw_test_name=$1 sw=$2 mpiexec=$3
shift 3
mpirun=("$mpiexec" "$@")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "$sw_test_name: FAIL: $*"; exit 1; }

prepare_text() {
  local i
  for i in $(seq 1 "$1"); do echo "line $i: the quick brown fox jumps over $((i * 7 % 13)) lazy dogs"; done >"$work/text.txt"
  "$sw" data prepare "$work/text.txt" --out "$work/train.bin" --val "$work/val.bin" >/dev/null ||
    fail "data prepare"
}
