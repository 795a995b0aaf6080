#!/usr/bin/env bash
# rotate-log.sh FILE [KEEP]: FILE becomes FILE.1, FILE.1 FILE.2 ..., at most KEEP (default 3) old logs kept,
# so a rerun does not overwrite the log of the run before it.
set -euo pipefail
file=$1
keep=${2:-3}
[[ -e $file ]] || exit 0
rm -f "$file.$keep"
for ((i = keep - 1; i >= 1; i--)); do
  if [[ -e $file.$i ]]; then mv -f "$file.$i" "$file.$((i + 1))"; fi
done
mv -f "$file" "$file.1"
