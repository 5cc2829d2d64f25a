#!/bin/bash
# The GPU acceptance run: real SGLang on the lent GPU machine (the `device` tool of this workplace),
# and ddtree-ops' runtime tools against it. docs/testing.md ("GPU acceptance run") says how and why.
#
#   scripts/gpu-acceptance.sh prepare        here: PyPI -> the two carries .gpu1/ and .gpu2/ (< 64 MiB each)
#   device run: bash scripts/gpu-acceptance/stage.sh 1 .gpu1                                carry [".gpu1"]
#   device run: bash scripts/gpu-acceptance/stage.sh 2 .gpu2 && bash scripts/gpu-acceptance/run.sh   carry [".gpu2"]
#               (the second call within the machine's 30 s warm window of the first)
#   scripts/gpu-acceptance.sh collect FILE   here: unpack the run's acceptance.tgz into tests/fixtures/gpu/
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
prepare)
  t=$(mktemp -d); bash scripts/gpu-acceptance/fetch.sh "$t"
  for n in 1 2; do rm -rf .gpu$n; mv "$t/call$n" .gpu$n
    grep -qx "/.gpu$n/" .git/info/exclude 2>/dev/null || echo "/.gpu$n/" >> .git/info/exclude; done
  rm -rf "$t"; du -sh .gpu1 .gpu2;;
collect)
  f=${2:?usage: gpu-acceptance.sh collect acceptance.tgz}
  day=$(tar -xOzf "$f" acc/versions.txt | head -1 | cut -c1-10)
  [[ $day =~ ^[0-9]{4}-[0-9]{2}-[0-9]{2}$ ]] || { echo "collect: no date in acc/versions.txt" >&2; exit 2; }
  d=tests/fixtures/gpu/acceptance-sglang-0.5.17-h200-$day
  rm -rf "$d"; mkdir -p "$d"; tar -xzf "$f" -C "$d" --strip-components=1
  (cd tests/fixtures && grep -v "  gpu/acceptance-sglang-0.5.17-h200-$day/" SHA256SUMS > SHA256SUMS.new || true
   find "gpu/acceptance-sglang-0.5.17-h200-$day" -type f | sort | xargs sha256sum >> SHA256SUMS.new && mv SHA256SUMS.new SHA256SUMS)
  echo "collected into $d ($(find "$d" -type f | wc -l) files)";;
*) sed -n 2,10p "$0"; exit 2;;
esac
