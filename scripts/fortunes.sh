# Sourced: prepare_fortunes SHARDWISE tokenises Debian's fortune files byte by byte into
# data/fortunes_{train,val}.bin (5% validation) unless both exist. The fortune text files are
# the ones without an extension (.dat/.u8 are indexes). Run from the repository root.
prepare_fortunes() {
  local sw=$1
  mkdir -p data
  if [ ! -s data/fortunes_train.bin ] || [ ! -s data/fortunes_val.bin ]; then
    local texts
    mapfile -t texts < <(find /usr/share/games/fortunes -maxdepth 1 -type f ! -name '*.*' | sort)
    "$sw" data prepare "${texts[@]}" --out data/fortunes_train.bin --val data/fortunes_val.bin \
      --val-fraction 0.05 >&2
  fi
}
