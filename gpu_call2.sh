#!/bin/bash
# Device call 2 (not committed): build the remaining CUDA tests while PyTorch's compiled GPT-2
# runs, then cuda_train (without its NCCL case), the NCCL cases one by one, the shared-GPU test.
set -u
O=$OUT; D=$((SECONDS + ${DL:-255}))
left() { local l=$((D - SECONDS)); ((l > $1)) && l=$1; ((l < 1)) && l=1; echo $l; }
ts() { echo "[$(date +%T) t=$SECONDS] $*" | tee -a $O/timeline.txt; }
ts start
( CTEST_TIMEOUT=60 bash scripts/gpu_build.sh --build > $O/build.txt 2>&1; echo "build rc $?" >> $O/build.txt; ts build done ) &
BP=$!
ts torch gpt2 compile
timeout 110 python3 bench/torch_gpu_step.py --model gpt2 --mode compile --device cuda --batch 16 --steps 5 --warmup 3 --peak-flops 989e12 > $O/t_gpt2_compile.json 2> $O/t_gpt2_compile.err
ts "torch compile rc $?"
wait $BP
tail -12 $O/build.txt
. /tmp/swprefix/env.sh
cd build-gpu/tests/cuda || exit 1
ts cuda_train
SW_TEST_VERBOSE=1 OMP_NUM_THREADS=4 timeout $(left 100) ./test_cuda_train '~*NCCL*' -d yes > $O/cuda_train.txt 2>&1
ts "cuda_train rc $?"; tail -4 $O/cuda_train.txt
for c in "nccl group at one rank: made*" "nccl group at one rank: every*" "nccl group: count 0*" "the compute stream waits*"; do
  ts "nccl: $c"
  NCCL_DEBUG=WARN timeout $(left 8) ./test_nccl "$c" -d yes >> $O/nccl.txt 2>&1
  ts "rc $?"
done
ts shared_gpu_np2
(cd ../.. && timeout $(left 45) ctest -R cuda_train_shared_gpu_np2 --timeout 45 --output-on-failure > $O/shared.txt 2>&1)
ts "shared rc $?"; tail -3 $O/shared.txt
ts torch gpt2 eager
timeout $(left 40) python3 ../../../bench/torch_gpu_step.py --model gpt2 --mode eager --device cuda --batch 16 --steps 5 --warmup 3 --peak-flops 989e12 > $O/t_gpt2_eager.json 2> $O/t_gpt2_eager.err
ts "eager rc $?"
SW_TEST_VERBOSE=1 NCCL_DEBUG=WARN timeout $(left 15) ./test_cuda_train '*NCCL*' -d yes > $O/cuda_train_nccl.txt 2>&1
ts "cuda_train nccl rc $?"
cat $O/t_gpt2_compile.json $O/t_gpt2_eager.json; tail -3 $O/t_gpt2_compile.err
