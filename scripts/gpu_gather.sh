#!/usr/bin/env bash
# gpu_gather.sh: run on a Debian 12 (bookworm, amd64) machine with Debian's mirrors in reach.
# Downloads the Debian packages that a bare GPU machine (CUDA toolkit, CMake, Ninja, a C++
# compiler and a Python with PyTorch; no package manager, no network) lacks to build and test
# Shardwise, into .gpu/debs/ (git-ignored; the device tool carries it: carry [".gpu"]), and
# writes .gpu/manifest.tsv and .gpu/assumed.txt for scripts/gpu_build.sh, which unpacks them
# there. Idempotent: a second run downloads nothing and rewrites the same files.
#   scripts/gpu_gather.sh [--dry-run]   --dry-run: resolve and list the packages (name, version,
#                                       role), download and write nothing (CI runs this)
#
# What is taken: the build's headers and CMake packages without their Depends (-dev packages
# depend on compilers and other -dev packages a build of ours never reads), and the Depends
# closure of the libraries and programs that run (OpenMPI with mpirun and orted, OpenBLAS's
# OpenMP build, oneDNN, liburing), less the packages in `never` below. The libraries that
# the taken ELF files need and no taken package ships are the machine's to have: they are
# listed in .gpu/assumed.txt, with the newest glibc and libstdc++ symbol versions needed.
set -euo pipefail
cd "$(dirname "$0")/.."
export LC_ALL=C
out=.gpu
die() { echo "gpu_gather: $*" >&2; exit 1; }
dry=""
case "${1:-}" in
  --dry-run) dry=1 ;;
  -h | --help) awk 'NR > 1 && /^#/ {sub(/^# ?/, ""); print; next} NR > 1 {exit}' "$0"; exit 0 ;;
  "") ;;
  *) echo "gpu_gather: unknown argument '$1' (expected --dry-run or nothing)" >&2; exit 2 ;;
esac

# Headers, CMake packages and the unversioned .so links: taken without their Depends.
dev=(libopenmpi-dev libopenblas-openmp-dev libdnnl-dev liburing-dev nlohmann-json3-dev catch2
     libcli11-dev)
# What runs: taken with the closure of their Depends and Pre-Depends.
run=(openmpi-bin openmpi-common libopenmpi3 libopenblas0-openmp libdnnl2 liburing2)
# Never taken (a dependency with one of these among its alternatives counts as met):
#   the C and C++ runtime, which must be the machine's own compiler's (libgomp too: OpenBLAS
#   and oneDNN are built on GNU OpenMP, and so are we);
#   what only maintainer scripts use (dpkg -x runs none) and gcc's empty base package;
#   ssh, which mpirun needs only to reach other hosts;
#   hwloc's plugins (PCI, X11, OpenCL discovery), which hwloc loads if present and which pull
#   in X11 and libxml2.
never=" libc6 libgcc-s1 libstdc++6 libgomp1 gcc-12-base debconf adduser passwd perl
        openssh-client ssh-client libhwloc-plugins "

[ "$(uname -m)" = x86_64 ] || die "this machine is $(uname -m); the packages are chosen for amd64 here"
command -v apt-get >/dev/null && command -v apt-cache >/dev/null && command -v dpkg-deb >/dev/null ||
  die "needs apt-get, apt-cache and dpkg-deb (a Debian 12 machine)"
codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
[ "$codename" = bookworm ] ||
  die "this is '$codename', not Debian 12 (bookworm): the package names and versions are bookworm's"

# known PKG: apt has a candidate for PKG (its record is kept for field).
# field PKG NAME: one field of that record.
declare -A info
known() {
  [ -n "${info[$1]+set}" ] || info[$1]=$(apt-cache show --no-all-versions "$1" 2>/dev/null || true)
  [ -n "${info[$1]}" ]
}
field() { sed -n "s/^$2: //p" <<<"${info[$1]}" | head -1; }

missing=()
for p in "${dev[@]}" "${run[@]}"; do known "$p" || missing+=("$p"); done
if ((${#missing[@]})); then
  [ "$(id -u)" = 0 ] || die "apt knows no ${missing[*]}: run 'apt-get update' as root, then again"
  apt-get update -qq >/dev/null 2>&1 || die "apt-get update failed (no network or no Debian mirror?)"
  for p in "${missing[@]}"; do unset "info[$p]"; known "$p" || die "apt knows no package $p, even after apt-get update"; done
fi

# The closure, breadth first. role: need (the build's own: always unpacked there) or dep (a
# library package gpu_build.sh unpacks only where the machine lacks one of its libraries).
declare -A role
queue=()
for p in "${dev[@]}" "${run[@]}"; do role[$p]=need; done
queue=("${run[@]}")
while ((${#queue[@]})); do
  p=${queue[0]}
  queue=("${queue[@]:1}")
  deps=$( (field "$p" Pre-Depends; field "$p" Depends) | tr ',' '\n')
  while IFS= read -r d; do
    [ -n "$d" ] || continue
    pick=""
    IFS='|' read -ra alts <<<"$d"
    for a in "${alts[@]}"; do
      a=$(sed 's/([^)]*)//g; s/:any//; s/[[:space:]]//g' <<<"$a")
      if [[ $never == *" $a "* ]]; then pick=""; break; fi  # met by the machine
      if [ -z "$pick" ] && known "$a"; then pick=$a; fi        # first real alternative
    done
    if [ -n "$pick" ] && [ -z "${role[$pick]:-}" ]; then
      role[$pick]=dep
      queue+=("$pick")
    fi
  done <<<"$deps"
done

if [ -n "$dry" ]; then
  for p in $(printf '%s\n' "${!role[@]}" | sort); do
    printf '%s\t%s\t%s\n' "$p" "$(field "$p" Version)" "${role[$p]}"
  done
  echo "gpu_gather: --dry-run: ${#role[@]} packages resolved; nothing downloaded or written"
  exit 0
fi

# Download what is not here yet (checked against apt's SHA256), drop what is no longer wanted.
mkdir -p "$out/debs"
declare -A file
want=()
for p in "${!role[@]}"; do
  v=$(field "$p" Version)
  f="${p}_${v//:/%3a}_$(field "$p" Architecture).deb"  # apt-get download's name for it
  file[$p]=$f
  sum=$(field "$p" SHA256)
  if [ -f "$out/debs/$f" ] && [ "$(sha256sum "$out/debs/$f" | cut -d' ' -f1)" = "$sum" ]; then
    continue
  fi
  rm -f "$out/debs/$f"  # a partial or stale download
  want+=("$p=$v")
done
for f in "$out"/debs/*.deb; do
  [ -e "$f" ] || continue
  keep=""
  for p in "${!file[@]}"; do [ "${file[$p]}" = "$(basename "$f")" ] && keep=1 && break; done
  [ -n "$keep" ] || rm -f "$f"
done
if ((${#want[@]})); then
  log=$(mktemp)
  if ! (cd "$out/debs" && apt-get download -q -o APT::Sandbox::User=root "${want[@]}") >"$log" 2>&1; then
    reason=$(grep -m1 '^E:' "$log" || tail -1 "$log")
    rm -f "$log"
    die "apt-get download failed (no network or no Debian mirror?): $reason"
  fi
  rm -f "$log"
fi
for p in "${!role[@]}"; do
  [ -f "$out/debs/${file[$p]}" ] || die "${file[$p]} is missing after apt-get download"
done

# What each package ships (the sonames of its libraries) and what its ELF files need (other
# libraries, glibc and libstdc++ symbol versions), from the unpacked packages.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
declare -A sonames glibc
for p in "${!role[@]}"; do
  dpkg-deb -x "$out/debs/${file[$p]}" "$tmp/$p"
  : >"$tmp/$p.needed"
  : >"$tmp/$p.versions"
  s=""
  while IFS= read -r -d '' f; do
    dyn=$(readelf -d "$f" 2>/dev/null) || continue
    so=$(sed -n 's/.*(SONAME).*\[\(lib.*\)\]/\1/p' <<<"$dyn")
    [ -n "$so" ] && s="$s${s:+,}$so"
    sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' <<<"$dyn" >>"$tmp/$p.needed"
    objdump -p "$f" 2>/dev/null | grep -oE '(GLIBC|GLIBCXX)_[0-9.]+' >>"$tmp/$p.versions" || true
  done < <(find "$tmp/$p" -type f \( -name '*.so*' -o -path '*/bin/*' \) -print0)
  sonames[$p]=${s:--}
  glibc[$p]=$(sed -n 's/^GLIBC_//p' "$tmp/$p.versions" | sort -uV | tail -1)
done

{
  echo "# gpu_gather.sh $(date -u +%Y-%m-%d), Debian $(cat /etc/debian_version)"
  echo "# role need: always unpacked; dep: unpacked where the machine lacks one of its sonames."
  echo "# glibc: the newest GLIBC_ symbol version its ELF files need."
  printf '# package\tversion\tbytes\trole\tglibc\tfile\tsonames\n'
  for p in $(printf '%s\n' "${!role[@]}" | sort); do
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$p" "$(field "$p" Version)" \
      "$(stat -c %s "$out/debs/${file[$p]}")" "${role[$p]}" "${glibc[$p]:--}" "${file[$p]}" \
      "${sonames[$p]}"
  done
} >"$out/manifest.tsv"

shipped=$(printf '%s\n' "${sonames[@]}" | tr ',' '\n' | sort -u)
needed=$(cat "$tmp"/*.needed | sort -u)
maxv() { cat "$tmp"/*.versions | sed -n "s/^$1_//p" | sort -uV | tail -1; }
{
  echo "# Libraries that the packages in manifest.tsv need and do not ship: the GPU machine's own."
  echo "# Newest symbol versions needed: GLIBC_$(maxv GLIBC) GLIBCXX_$(maxv GLIBCXX)"
  comm -23 <(echo "$needed") <(echo "$shipped")
} >"$out/assumed.txt"

total=$(awk -F'\t' '!/^#/ {s += $3} END {print s}' "$out/manifest.tsv")
n=$(grep -vc '^#' "$out/manifest.tsv")
printf 'gpu_gather: %d packages, %.1f MiB in %s/debs (%d downloaded now); list in %s/manifest.tsv\n' \
  "$n" "$(awk -v s="$total" 'BEGIN {print s / 1048576}')" "$out" "${#want[@]}" "$out"
echo "gpu_gather: the GPU machine must have GLIBC_$(maxv GLIBC), GLIBCXX_$(maxv GLIBCXX) and" \
  "$(grep -v '^#' "$out/assumed.txt" | paste -sd' ')"
awk -F'\t' '!/^#/ && $5 != "-" {print $5, $1}' "$out/manifest.tsv" | sort -V | tail -1 |
  (read -r v p; echo "gpu_gather: the newest glibc is needed by $p ($v)")

# cuDNN's frontend headers (scripts/cudnn_frontend.sh) and this machine's cuDNN headers (used
# there only where the GPU machine has no cudnn.h): the CUDA backend's cuDNN attention.
bash scripts/cudnn_frontend.sh >/dev/null
rm -rf "$out/cudnn_frontend" "$out/cudnn_headers"
cp -r .deps/cudnn_frontend "$out/cudnn_frontend"
h=$(for d in /usr/local/cuda/include /usr/local/include /usr/include /usr/include/x86_64-linux-gnu; do
  [ -f "$d/cudnn.h" ] && { echo "$d"; break; }; done)
if [ -n "$h" ]; then
  mkdir -p "$out/cudnn_headers/include"
  cp -L "$h"/cudnn*.h "$out/cudnn_headers/include/"
  echo "gpu_gather: cuDNN's frontend and cuDNN $(sed -n 's/^#define CUDNN_\(MAJOR\|MINOR\|PATCHLEVEL\) \([0-9]*\).*/\2/p' "$h/cudnn_version.h" | paste -sd.)'s headers (from $h) in $out"
else
  echo "gpu_gather: cuDNN's frontend in $out; no cudnn.h here to take along"
fi
