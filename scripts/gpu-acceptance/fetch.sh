#!/bin/bash
# Download the wheel set of MANIFEST.tsv from PyPI (on a machine with pip and PyPI access), repack the two
# slimmed wheels, and lay them out as two carry folders (each < 64 MiB) for the device:
#   bash fetch.sh OUTDIR   ->  OUTDIR/call1 OUTDIR/call2 (wheels + SHA256SUMS.callN)
set -euo pipefail
G=$(cd "$(dirname "$0")" && pwd); OUT=${1:?usage: fetch.sh OUTDIR}; mkdir -p "$OUT/dl"
plat=(--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64
      --platform manylinux_2_27_x86_64 --platform manylinux_2_26_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64
      --platform manylinux2014_x86_64 --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64)
tail -n +2 "$G/MANIFEST.tsv" | while IFS=$'\t' read -r call name ver file bytes sha note; do
  mkdir -p "$OUT/$call"
  [ -f "$OUT/$call/$file" ] && continue
  python3 -m pip download -q --no-deps "${plat[@]}" -d "$OUT/dl" "$name==$ver" 2>&1 | grep -v 'is ignored' || true
  src=$(ls "$OUT/dl/$file" 2>/dev/null || true)
  [ -n "$src" ] || { echo "fetch: $name==$ver did not give $file" >&2; exit 1; }
  case $name in
    sglang_kernel)  # drop FA3 (flash_ops), FlashMLA, the sm100 build and InfLLM: an H200 (sm_90) loads sm90/common_ops only
      drop='sgl_kernel/(flash_ops|flashmla_ops|sm100/common_ops|infllm_ops)';;
    xgrammar)       # drop the static C++ library (link-time only)
      drop='xgrammar/lib/libxgrammar.a';;
    *) drop='';;
  esac
  if [ -n "$drop" ]; then
    t=$(mktemp -d); (cd "$t" && unzip -q "$src" && find . -type f | sed 's|^\./||' | grep -E "^($drop)" | xargs -r rm -f \
      && r=$(ls -d *.dist-info)/RECORD && grep -vE "^($drop)" "$r" > R && mv R "$r" && zip -q -r -9 "$OUT/$call/$file" .); rm -rf "$t"
  else
    echo "$sha  $src" | sha256sum -c --quiet || { echo "fetch: checksum of $file differs from MANIFEST.tsv" >&2; exit 1; }
    cp "$src" "$OUT/$call/$file"
  fi
done
for c in call1 call2; do (cd "$OUT/$c" && sha256sum *.whl > SHA256SUMS.$c); done
rm -rf "$OUT/dl"; du -sh "$OUT"/call*
