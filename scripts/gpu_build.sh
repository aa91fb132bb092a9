#!/usr/bin/env bash
# gpu_build.sh: builds and tests Shardwise's CUDA backend on a GPU machine that has the CUDA
# toolkit, CMake, Ninja, a C++ compiler and a python3 with PyTorch's NVIDIA wheels (cuDNN, NCCL),
# but no package manager and no network. The Debian packages that scripts/gpu_gather.sh put in
# .gpu/ (carried along: the device tool's carry [".gpu"]) are unpacked into a prefix, not
# installed; CMake finds them there through CMAKE_PREFIX_PATH and the programs through the
# prefix's env.sh (PATH, LD_LIBRARY_PATH, OpenMPI's OPAL_PREFIX).
#
#   bash scripts/gpu_build.sh [--facts-only | --build | --test | --bench | --unit]... [options]
#     --facts-only  print what this script relies on about the machine and check it; nothing else
#     --unpack      that, then unpack the packages into the prefix and check that they load (ldd)
#     --build       unpack the packages, configure (-DSW_CUDA=ON, Release) and build the CUDA
#                   tests and benchmarks
#     --test        that, then run them: ctest -L cuda, the other cuda_* tests, bench*cuda* if any
#     --bench       unpack, configure, build the shardwise tool, then run bench/gpu_vs_torch.sh:
#                   Shardwise against PyTorch eager and torch.compile on GPT-2 124M and a 1.3B
#                   Llama (~4-6 minutes; BENCH_ARGS adds its options, e.g. BENCH_ARGS=--quick
#                   for GPT-2 only); its table, JSON and run logs go with the other logs
#     --unit        build everything, then ctest -L unit and one 2-rank MPI test (comm_mpi_np2)
#     (nothing)     --test --unit (not --bench)
#   options: --prefix=DIR (or SW_PREFIX; default /tmp/swprefix), --arch=LIST (or CUDA_ARCHS;
#   default 90), --build-dir=DIR (or BUILD_DIR; default build-gpu), -jN (or JOBS; default nproc);
#   CTEST_TIMEOUT: seconds per test (default 600)
#
# Every phase first does what it needs and the machine lacks (the prefix carries a stamp, ninja
# builds only what changed), so one lease can be spent in pieces on a warm machine: --build,
# then --test, then --bench, then --unit. The facts are printed first on every run, so any run's
# output tells the next session what the machine has. Logs go to $OUT/gpu_build/ when OUT is set (the device
# tool returns what is under $OUT), else to <build-dir>/logs/; a summary table is printed last.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
repo=$PWD
export LC_ALL=C

prefix=${SW_PREFIX:-/tmp/swprefix}
archs=${CUDA_ARCHS:-90}
build=${BUILD_DIR:-build-gpu}
jobs=${JOBS:-$(nproc)}
facts_only="" do_unpack="" do_build="" do_test="" do_unit="" do_bench=""
for a in "$@"; do
  case "$a" in
    --facts-only) facts_only=1 ;;
    --unpack) do_unpack=1 ;;
    --build) do_build=1 ;;
    --test) do_build=1 do_test=1 ;;
    --unit) do_unit=1 ;;
    --bench) do_bench=1 ;;
    --prefix=*) prefix=${a#*=} ;;
    --arch=*) archs=${a#*=} ;;
    --build-dir=*) build=${a#*=} ;;
    -j*) jobs=${a#-j} ;;
    -h | --help) sed -n '2,/^set /{/^#/s/^# \{0,1\}//p}' "$repo/scripts/gpu_build.sh"; exit 0 ;;
    *) echo "gpu_build: unknown argument '$a' (--help lists them)" >&2; exit 2 ;;
  esac
done
[ -n "$facts_only$do_unpack$do_build$do_unit$do_bench" ] || do_build=1 do_test=1 do_unit=1
case $prefix in /*) ;; *) prefix=$repo/$prefix ;; esac
case $build in /*) ;; *) build=$repo/$build ;; esac
gpu=$repo/.gpu
logs=${OUT:+$OUT/gpu_build}
logs=${logs:-$build/logs}
mkdir -p "$logs"
arch_dir=x86_64-linux-gnu

summary=()   # "phase|result|seconds"
t0=$SECONDS
note() { summary+=("$1|$2|$(($SECONDS - t0))"); t0=$SECONDS; }
finish() {
  echo
  echo "== summary (logs in $logs)"
  printf '%-10s %-60s %s\n' phase result seconds
  for s in "${summary[@]}"; do
    IFS='|' read -r p r t <<<"$s"
    printf '%-10s %-60s %s\n' "$p" "$r" "$t"
  done
  exit "$1"
}
fail() { echo "gpu_build: $2"; note "$1" "FAILED: $2"; finish 1; }

# ---- facts ------------------------------------------------------------------------------------
# have_soname NAME: the dynamic loader finds NAME on this machine without our prefix (in its
# cache or a default folder, as a regular file).
have_soname() {
  local ldc path d
  ldc=$(command -v ldconfig || echo /sbin/ldconfig)
  if [ -x "$ldc" ]; then
    while read -r path; do [ -f "$path" ] && return 0; done \
      < <("$ldc" -p 2>/dev/null | awk -v s="$1" '$1 == s && /x86-64/ {print $NF}')
  fi
  for d in /lib/$arch_dir /usr/lib/$arch_dir /lib64 /usr/lib64 /lib /usr/lib; do
    [ -f "$d/$1" ] && return 0
  done
  return 1
}
glibc_version() {
  { ldd --version 2>/dev/null || getconf GNU_LIBC_VERSION 2>/dev/null; } | sed -n '1s/.* //p'
}
# version_ge A B: version A is B or newer.
version_ge() { [ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | sed -n 1p)" = "$2" ]; }
gpus() { nvidia-smi -L 2>/dev/null | grep '^GPU' | tr '\n' ';'; }
pip_dir() {  # pip_dir NAME: site-packages/nvidia/NAME of python3's wheels, if any
  python3 -c "import nvidia.$1 as m; print(list(m.__path__)[0])" 2>/dev/null
}

# cudnn_header: the machine's cudnn.h (python3's nvidia.cudnn wheel or the CUDA toolkit) with
# its version; fails when neither has one.
cudnn_header() {
  local d f
  d=$(pip_dir cudnn)
  for f in ${d:+"$d/include/cudnn.h"} "$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")/include/cudnn.h"; do
    [ -f "$f" ] || continue
    echo "$f $(sed -n 's/^#define CUDNN_\(MAJOR\|MINOR\|PATCHLEVEL\) \([0-9]*\).*/\2/p' "$(dirname "$f")/cudnn_version.h" 2>/dev/null | paste -sd.)"
    return 0
  done
  return 1
}

facts() {
  local bad=() t v glibc need so
  fact() { printf '%-18s %s\n' "$1" "${2:-(none)}"; }
  which_or() { command -v "$1" 2>/dev/null || echo "(none)"; }
  echo "== facts"
  v=$(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo)
  fact machine "$(uname -m), kernel $(uname -r), $(nproc) cores, $v memory, user $(id -un)"
  fact os "$(. /etc/os-release 2>/dev/null && echo "$PRETTY_NAME" || echo unknown)"
  glibc=$(glibc_version)
  fact glibc "$glibc"
  free_in() { df -h "$1" 2>/dev/null | awk 'NR == 2 {print $4 " free in " $6}'; }
  fact disk "$(free_in "$(dirname "$prefix")"), repo: $(free_in "$repo")"
  for t in c++ g++ gcc nvcc cmake ninja python3 ar tar xz zstd dpkg dpkg-deb ldconfig pkg-config \
           readelf mpirun nvidia-smi; do
    fact "which $t" "$(which_or "$t")"
  done
  fact "g++" "$(g++ --version 2>/dev/null | sed -n 1p)"
  fact nvcc "$(nvcc --version 2>/dev/null | grep release)"
  fact cmake "$(cmake --version 2>/dev/null | sed -n 1p)"
  fact ninja "$(ninja --version 2>/dev/null || echo none)"
  fact gpus "$(gpus)"
  fact driver "$(nvidia-smi --query-gpu=driver_version,memory.total,compute_cap \
                   --format=csv,noheader 2>/dev/null | sed -n 1p)"
  fact python3 "$(python3 -c 'import sys; print(sys.executable, sys.version.split()[0])' 2>/dev/null)"
  fact torch "$(python3 -c 'import torch as t
print(t.__version__, "cuda", t.version.cuda, "gpu", t.cuda.is_available())' 2>/dev/null)"
  for t in cudnn nccl cublas cuda_runtime; do
    v=$(pip_dir $t)
    fact "nvidia.$t" "${v:-(none)}${v:+: $(ls "$v/lib" 2>/dev/null | tr '\n' ' ')}"
  done
  fact "cudnn.h" "$(cudnn_header || echo '(none: .gpu/cudnn_headers is used)')"
  v=$(command -v nvcc) && v=$(dirname "$(dirname "$(readlink -f "$v")")")
  fact "cuda toolkit" \
    "${v:-(none)}: $(ls "$v"/lib64/libcublas.so* "$v"/targets/*/lib/libcublas.so* 2>/dev/null | tr '\n' ' ')"

  [ "$(uname -m)" = x86_64 ] || bad+=("not x86-64: the packages in .gpu are amd64")
  command -v nvcc >/dev/null || bad+=("no nvcc")
  command -v g++ >/dev/null || command -v c++ >/dev/null || bad+=("no C++ compiler (nvcc needs one too)")
  v=$(cmake --version 2>/dev/null | sed -n 1p | grep -oE '[0-9]+\.[0-9]+(\.[0-9]+)?')
  version_ge "$v" 3.25 || bad+=("cmake $v: 3.25 or newer needed")
  command -v ninja >/dev/null || bad+=("no ninja")
  v=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | sed -n '1s/\.//p')
  if [ -n "$v" ] && ! [[ ";${archs//,/;};" =~ \;${v}a?(-real|-virtual)?\; ]]; then
    bad+=("the GPU is sm_$v and the build is for $archs: give --arch=$v")
  fi
  command -v python3 >/dev/null || bad+=("no python3")
  if [ ! -f "$gpu/manifest.tsv" ]; then
    bad+=("no .gpu/manifest.tsv: run scripts/gpu_gather.sh on a Debian 12 machine and carry .gpu")
  else
    while IFS=$'\t' read -r p _ _ role need f _; do
      [ -f "$gpu/debs/$f" ] || bad+=("missing .gpu/debs/$f")
      if [ "$role" = need ] && [ "$need" != - ] && ! version_ge "$glibc" "$need"; then
        bad+=("$p needs glibc $need, this machine has $glibc")
      fi
    done < <(grep -v '^#' "$gpu/manifest.tsv")
    for so in $(grep -v '^#' "$gpu/assumed.txt"); do
      have_soname "$so" || bad+=("the packages need $so and this machine has none")
    done
  fi
  if ! command -v dpkg-deb >/dev/null && ! command -v ar >/dev/null && ! python3 -c 'import lzma' 2>/dev/null; then
    bad+=("cannot unpack a .deb: no dpkg-deb, no ar, no python3 with lzma")
  fi
  for t in "${bad[@]}"; do echo "FACT-CHECK FAILED: $t"; done
  ((${#bad[@]} == 0))
}

facts 2>&1 | tee "$logs/facts.log"
if [ "${PIPESTATUS[0]}" != 0 ]; then
  fail facts "the machine lacks what the build needs (FACT-CHECK lines above)"
fi
note facts ok
[ -z "$facts_only" ] || finish 0

# ---- unpack -----------------------------------------------------------------------------------
# unpack_deb DEB DIR: dpkg-deb if there is one, else ar + tar, else python3 (a .deb is an ar
# archive whose data.tar.{xz,zst,gz} member holds the files; Debian 12's use xz).
unpack_deb() {
  if command -v dpkg-deb >/dev/null; then dpkg-deb -x "$1" "$2"; return; fi
  local member
  if command -v ar >/dev/null && member=$(ar t "$1" | grep '^data\.tar'); then
    local z=""
    case $member in
      *.xz) z="xz -dc" ;; *.zst) z="zstd -dc" ;; *.gz) z="gzip -dc" ;; *.tar) z="cat" ;;
    esac
    if [ -n "$z" ] && command -v "${z%% *}" >/dev/null; then
      ar p "$1" "$member" | $z | tar -x -C "$2"
      return
    fi
  fi
  python3 - "$1" "$2" <<'EOF'
import io, subprocess, sys, tarfile
deb, dest = sys.argv[1], sys.argv[2]
data = open(deb, "rb").read()
assert data[:8] == b"!<arch>\n", deb + ": not an ar archive"
pos = 8
while pos + 60 <= len(data):
    name = data[pos:pos + 16].decode().strip().rstrip("/")
    size = int(data[pos + 48:pos + 58].decode())
    body = data[pos + 60:pos + 60 + size]
    pos += 60 + size + (size & 1)
    if not name.startswith("data.tar"):
        continue
    if name.endswith(".zst"):
        try:
            import zstandard
            body = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(body)).read()
        except ImportError:
            body = subprocess.run(["zstd", "-dc"], input=body, stdout=subprocess.PIPE, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(body), mode="r:*") as t:
        kw = {"filter": "fully_trusted"} if hasattr(tarfile, "fully_trusted_filter") else {}
        t.extractall(dest, **kw)
    sys.exit(0)
sys.exit(deb + ": no data.tar member")
EOF
}

write_env() {
  local lib=$prefix/usr/lib/$arch_dir d dirs=""
  for d in "$lib" "$prefix/lib/$arch_dir" "$lib/openmpi/lib" "$lib/openblas-openmp" "$lib/pmix2/lib"; do
    dirs="$dirs${dirs:+:}$d"
  done
  for d in nccl cudnn; do
    d=$(pip_dir $d) && [ -d "$d/lib" ] && dirs="$dirs:$d/lib"
  done
  cat >"$prefix/env.sh" <<EOF
# Written by scripts/gpu_build.sh: the unpacked Debian packages in $prefix.
export SW_PREFIX=$prefix
export PATH=$prefix/usr/bin\${PATH:+:\$PATH}
export LD_LIBRARY_PATH=$dirs\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}
export CMAKE_PREFIX_PATH=$prefix/usr\${CMAKE_PREFIX_PATH:+:\$CMAKE_PREFIX_PATH}
# OpenMPI finds its components, help files and wrapper data relative to OPAL_PREFIX, its
# configuration (Debian's: no UCX or OFI transports) in OPAL_SYSCONFDIR.
export OPAL_PREFIX=$prefix/usr
export OPAL_SYSCONFDIR=$prefix/etc/openmpi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
EOF
}

# ldd_check: every ELF file in the prefix loads: its libraries resolve (from the prefix or the
# machine) with the symbol versions it needs. A gap in what Shardwise itself loads fails; a gap
# in a plugin (an MPI transport, a UCX module) is listed and left.
ldd_check() {
  command -v ldd >/dev/null || { echo "ldd: none on this machine, nothing checked"; return 0; }
  local f out broken=0 core
  core='/(libmpi\.so\.40|libopen-(pal|rte)\.so\.40|libopenblas\.so\.0|libdnnl\.so\.2|liburing\.so\.2'
  core+='|orted|orterun|opal_wrapper)$'
  : >"$logs/ldd_missing.txt"
  while IFS= read -r -d '' f; do
    out=$(ldd "$f" 2>&1)
    grep -q 'not a dynamic executable' <<<"$out" && continue
    # "libX.so.1 => not found", or "...: version `GLIBC_2.36' not found (required by ...)"
    grep 'not found' <<<"$out" | sed -E "s/^[[:space:]]*([^ ]+) => not found.*/\1/;
      s/.*(version [^ ]+) not found.*/\1/; s|\$|\t${f#$prefix}|" >>"$logs/ldd_missing.txt"
    if grep -q 'not found' <<<"$out" && [[ $f =~ $core ]]; then broken=1; fi
  done < <(find "$prefix" -type f \( -name '*.so*' -o -path '*/bin/*' \) -print0)
  if [ -s "$logs/ldd_missing.txt" ]; then
    echo "ldd: unresolved in the prefix (count, library or symbol version; files in ldd_missing.txt):"
    cut -f1 "$logs/ldd_missing.txt" | sort | uniq -c | sort -rn
  else
    echo "ldd: every library and program in the prefix resolves"
  fi
  return $broken
}

unpack() {
  local want=() files=() skipped=() p role need f sonames so missing glibc stamp
  glibc=$(glibc_version)
  while IFS=$'\t' read -r p _ _ role need f sonames; do
    if [ "$role" = dep ] && [ "$sonames" != - ]; then
      missing=""
      for so in ${sonames//,/ }; do have_soname "$so" || { missing=$so; break; }; done
      if [ -z "$missing" ]; then skipped+=("$p"); continue; fi
      if [ "$need" != - ] && ! version_ge "$glibc" "$need"; then
        echo "$p (for $missing, which this machine lacks) needs glibc $need; it has $glibc"
        return 1
      fi
    fi
    want+=("$p")
    files+=("$f")
  done < <(grep -v '^#' "$gpu/manifest.tsv")
  # Redone when the packages, this script or the machine's choice of packages changes.
  stamp="$(cat "$gpu/manifest.tsv" "$repo/scripts/gpu_build.sh" | sha256sum | cut -c1-16) ${want[*]}"
  if [ -f "$prefix/.sw_stamp" ] && [ "$(cat "$prefix/.sw_stamp")" = "$stamp" ]; then
    echo "prefix $prefix is up to date (${#want[@]} packages)"
    write_env
    return 0
  fi
  if [ -e "$prefix" ]; then
    if [ -f "$prefix/.sw_stamp" ] || [ -z "$(ls -A "$prefix")" ]; then
      rm -rf "$prefix"
    else
      echo "$prefix exists and is not a prefix of ours: give another with --prefix"
      return 1
    fi
  fi
  mkdir -p "$prefix"
  for f in "${files[@]}"; do
    unpack_deb "$gpu/debs/$f" "$prefix" || { echo "unpacking $f failed"; return 1; }
  done
  echo "unpacked ${#want[@]} packages into $prefix: ${want[*]}"
  echo "the machine has the libraries of ${#skipped[@]} more: ${skipped[*]:-none}"

  # Absolute links inside the packages point into /; make them point into the prefix.
  while IFS= read -r -d '' f; do
    ln -sfn "$prefix$(readlink "$f")" "$f"
  done < <(find "$prefix" -type l -lname '/*' -print0)
  # The links Debian's alternatives make (maintainer scripts, which unpacking never runs) that
  # the build and the MPI runtime use: LINK:TARGET, TARGET relative to LINK's folder.
  for f in usr/bin/mpirun:mpirun.openmpi usr/bin/mpiexec:mpiexec.openmpi \
           usr/bin/mpicc:mpicc.openmpi usr/bin/mpicxx:mpicxx.openmpi \
           usr/lib/$arch_dir/libpsm_infinipath.so.1:../libpsm1/libpsm_infinipath.so.1.16; do
    p=$prefix/${f%%:*}
    [ -e "$(dirname "$p")/${f#*:}" ] && ln -sfn "${f#*:}" "$p"
  done
  write_env
  (
    . "$prefix/env.sh"
    ldd_check || exit 1
    # OpenMPI relocated: its compiler wrapper reports headers in the prefix.
    inc=$(mpicc --showme:incdirs 2>&1) || { echo "mpicc --showme failed: $inc"; exit 1; }
    echo "mpicc --showme:incdirs: $inc"
    [[ $inc == "$prefix"/* ]] || { echo "OpenMPI is not relocated (OPAL_PREFIX)"; exit 1; }
  ) || return 1
  echo "$stamp" >"$prefix/.sw_stamp"
}

unpack 2>&1 | tee "$logs/unpack.log"
[ "${PIPESTATUS[0]}" = 0 ] || fail unpack "see $logs/unpack.log"
note unpack "$(($(wc -w <"$prefix/.sw_stamp") - 1)) packages in $prefix"
. "$prefix/env.sh"
[ -n "$do_build$do_unit$do_bench" ] || finish 0

# ---- configure and build ----------------------------------------------------------------------
# cuDNN's frontend headers travel in .gpu (gpu_gather.sh); so do cuDNN's own headers, used only
# where the machine has no cudnn.h (its wheel may ship the libraries alone).
cudnn_args=()
[ -f "$repo/.gpu/cudnn_frontend/include/cudnn_frontend.h" ] &&
  cudnn_args+=("-DSW_CUDNN_FRONTEND_ROOT=$repo/.gpu/cudnn_frontend")
if ! cudnn_header >/dev/null && [ -f "$repo/.gpu/cudnn_headers/include/cudnn.h" ]; then
  cudnn_args+=("-DSW_CUDNN_INCLUDE=$repo/.gpu/cudnn_headers/include")
fi
if ! cmake -S "$repo" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSW_CUDA=ON \
     "-DCMAKE_CUDA_ARCHITECTURES=$archs" "-DCMAKE_PREFIX_PATH=$prefix/usr" "${cudnn_args[@]}" \
     >"$logs/configure.log" 2>&1; then
  tail -30 "$logs/configure.log"
  fail configure "see $logs/configure.log"
fi
# Where each dependency was found: the Debian ones should be in the prefix (a machine that has
# one of its own may serve it; that is said, not refused).
echo "== found"
outside=0
while IFS='=' read -r var val; do
  var=${var%%:*}
  printf '%-22s %s\n' "$var" "$val"
  case $var in
    SW_NCCL* | SW_CUDNN* | CMAKE_*) ;;
    *) [[ $val == "$prefix"/* ]] || { echo "  ^ not in $prefix"; outside=$((outside + 1)); } ;;
  esac
done < <(grep -E "^($(echo MPI_C_COMPILER MPIEXEC_EXECUTABLE MPI_mpi_LIBRARY SW_OPENBLAS \
  SW_CBLAS_INCLUDE SW_DNNL_LIB SW_DNNL_INCLUDE SW_URING_LIB SW_URING_INCLUDE Catch2_DIR \
  nlohmann_json_DIR CLI11_DIR SW_NCCL SW_NCCL_INCLUDE SW_CUDNN SW_CUDNN_INCLUDE \
  SW_CUDNN_FRONTEND_INCLUDE \
  CMAKE_CUDA_COMPILER CMAKE_CXX_COMPILER | tr ' ' '|')):" "$build/CMakeCache.txt")
note configure "CUDA archs $archs; $outside dependencies outside the prefix; $(grep -o 'cuDNN attention [a-z ]*' "$logs/configure.log" | head -1)"

# The CUDA test and benchmark executables: test_cuda*, test_nccl*, and bench* with cuda in the name.
cuda_targets=$(ninja -C "$build" -t targets all 2>/dev/null |
  sed -n 's/^\(test_cuda[a-z0-9_]*\|test_nccl[a-z0-9_]*\|bench[a-z0-9_]*cuda[a-z0-9_]*\): phony$/\1/p' | sort -u)
if [ -n "$do_build" ]; then
  [ -n "$cuda_targets" ] || fail build "no test_cuda* targets: the CUDA backend is not configured"
  # shellcheck disable=SC2086
  if ! cmake --build "$build" -j "$jobs" --target $cuda_targets >"$logs/build_cuda.log" 2>&1; then
    grep -E 'error|FAILED' "$logs/build_cuda.log" | head -20
    fail build "see $logs/build_cuda.log"
  fi
  note build "$(echo $cuda_targets)"
fi

# ---- tests ------------------------------------------------------------------------------------
# ctest_run NAME ARGS...: ctest with ARGS in the build dir; its log, and a one-line result.
ctest_run() {
  local name=$1 res
  shift
  (cd "$build" && ctest --output-on-failure --timeout "${CTEST_TIMEOUT:-600}" "$@") >"$logs/$name.log" 2>&1
  local rc=$?
  res=$(grep -E 'tests passed|No tests were found' "$logs/$name.log" | tail -1)
  local skipped
  skipped=$(grep -cE '\*\*\*Skipped|Not Run' "$logs/$name.log")
  [ "$skipped" = 0 ] && skipped=""
  # A CUDA test skips only where it finds no GPU: with one, that is a failure, except the
  # 2-rank NCCL test (one GPU a rank) on a machine of one GPU, which says why it skipped.
  if [[ $name == cuda* ]] && [ -n "$skipped" ] && [ -n "$(gpus)" ]; then
    local unexpected=$skipped
    if (($(gpus | tr ';' '\n' | grep -c '^GPU') < 2)) &&
      grep -q 'fewer than 2 CUDA devices' "$logs/$name.log"; then
      unexpected=$(grep -E '\*\*\*Skipped|Not Run' "$logs/$name.log" | grep -vc 'cuda_nccl_mpi_np2')
      skipped="$skipped (the 2-GPU NCCL test, on one GPU)"
    fi
    if [ "$unexpected" != 0 ]; then
      rc=1
      skipped="$skipped (with a GPU present!)"
    fi
  fi
  note "$name" "${res:-ctest exit $rc}${skipped:+, $skipped skipped}"
  tail -5 "$logs/$name.log"
  return $rc
}
status=0
if [ -n "$do_test" ]; then
  echo "== CUDA tests"
  # -V: the log keeps each op's error against the CPU (SHARDWISE_TEST_VERBOSE), passed or not.
  # cuDNN's description of this GPU (test_cuda_ops writes it), for tests/data/cudnn_devices/:
  # test_cudnn_offline then checks the attention graphs for it on machines without a GPU.
  SHARDWISE_TEST_CUDNN_DEVICE_OUT="$logs/cudnn_device_$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null |
    sed -n 1p | tr -c 'A-Za-z0-9\n' '_' | sed 's/_*$//').json" \
    SHARDWISE_TEST_VERBOSE=1 ctest_run cuda -L cuda -V || status=1
  # A CUDA test that crashed: its stack from cuda-gdb (at most 30 s each) in gdb_<test>.log, so
  # the session after the lease knows where (the H200 lease of 2026-11-27 needed a second call
  # for it). Tests run through mpiexec are left out.
  if command -v cuda-gdb >/dev/null; then
    for num in $(grep -E '^ *[0-9]+/[0-9]+ Test +#[0-9]+: .*(SegFault|Subprocess aborted|Exception)' \
      "$logs/cuda.log" | grep -oE '#[0-9]+' | tr -d '#'); do
      cmd=$(grep -m1 "^$num: Test command:" "$logs/cuda.log" | sed 's/^[0-9]*: Test command: //')
      [ -z "$cmd" ] || [[ $cmd == *mpiexec* ]] && continue
      # shellcheck disable=SC2086
      (cd "$build" && timeout -k 5 30 cuda-gdb -batch -ex run -ex bt --args $cmd) \
        >"$logs/gdb_$num.log" 2>&1
      note "gdb_$num" "stack of crashed test #$num: $(grep -m1 '^#0' "$logs/gdb_$num.log" | cut -c1-60)"
    done
  fi
  SHARDWISE_TEST_VERBOSE=1 ctest_run cuda_unit -R '^cuda_' -LE cuda -V || status=1
  benches=$(grep '^bench' <<<"$cuda_targets")
  for b in $benches; do
    exe=$(find "$build" -type f -name "$b" -perm -u+x | head -1)
    if "$exe" >"$logs/$b.log" 2>&1; then note "$b" "ok (log $b.log)"; else note "$b" "FAILED"; status=1; fi
    tail -20 "$logs/$b.log"
  done
  [ -n "$benches" ] || note bench "no bench*cuda* executables (the comparison with PyTorch: --bench)"
  # bench_cuda_gemm's peer: PyTorch's bf16 products for the same shapes.
  if timeout -k 5 120 python3 "$repo/bench/torch_gemm.py" >"$logs/torch_gemm.log" 2>&1; then
    note torch_gemm "ok (log torch_gemm.log)"
  else
    note torch_gemm "FAILED (log torch_gemm.log)"
  fi
  tail -32 "$logs/torch_gemm.log"
fi

# ---- the comparison with PyTorch (bench/gpu_vs_torch.sh) ---------------------------------------
if [ -n "$do_bench" ]; then
  echo "== Shardwise vs PyTorch (bench/gpu_vs_torch.sh ${BENCH_ARGS:-})"
  if ! cmake --build "$build" -j "$jobs" --target shardwise >"$logs/build_shardwise.log" 2>&1; then
    grep -E 'error|FAILED' "$logs/build_shardwise.log" | head -20
    fail build_tool "see $logs/build_shardwise.log"
  fi
  note build_tool "tools/shardwise"
  # shellcheck disable=SC2086
  bash "$repo/bench/gpu_vs_torch.sh" --build "$build" --out "$logs" ${BENCH_ARGS:-} 2>&1 |
    tee "$logs/bench.log"
  if [ "${PIPESTATUS[0]}" = 0 ]; then
    note bench "ok (gpu_vs_torch.txt, gpu_vs_torch.json)"
  else
    note bench "FAILED or incomplete (gpu_vs_torch.txt, bench.log)"
    status=1
  fi
fi

if [ -n "$do_unit" ]; then
  echo "== everything, unit tests, one MPI test"
  if ! cmake --build "$build" -j "$jobs" >"$logs/build_all.log" 2>&1; then
    grep -E 'error|FAILED' "$logs/build_all.log" | head -20
    fail build_all "see $logs/build_all.log"
  fi
  note build_all ok
  # Half as many tests at once as cores: each runs 2 OpenMP threads (SW_TEST_OMP_THREADS).
  ctest_run unit -L unit -j "$(((jobs + 1) / 2))" || status=1
  ctest_run mpi_smoke -R '^comm_mpi_np2$' || status=1
fi
finish $status
