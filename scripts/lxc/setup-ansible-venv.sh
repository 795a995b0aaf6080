#!/usr/bin/env bash
# Create (or update) the Ansible tooling venv: scripts/lxc/setup-ansible-venv.sh [DIR]  (default .venv-ansible)
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV=${1:-.venv-ansible}
PYTHON=${PYTHON:-python3}
[[ -x $VENV/bin/python ]] || "$PYTHON" -m venv "$VENV"
"$VENV/bin/pip" install -q --disable-pip-version-check -r requirements-ansible.txt
"$VENV/bin/python" -c "import ansible.release as r; print(\"ansible-core\", r.__version__)"
touch "$VENV/.setup-done"
