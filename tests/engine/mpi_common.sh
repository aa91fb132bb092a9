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

source "$(dirname "${BASH_SOURCE[0]}")/../common/text_run.sh"  # prepare_text, tiny_gpt_config
