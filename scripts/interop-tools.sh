#!/usr/bin/env bash
# Installs the Python clients of the interop tests (interop/requirements.txt, pinned) in
# a venv under ~/.cache/oncebox/tools (or $ONCEBOX_TOOLS) and prints its python, for
# ONCEBOX_PYTHON:
#
#   export ONCEBOX_PYTHON=$(scripts/interop-tools.sh)
#
# Needs python3; installs Debian's python3-venv when its venv module is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
TOOLS=${ONCEBOX_TOOLS:-$HOME/.cache/oncebox/tools}
VENV=$TOOLS/interop-venv
STAMP=$VENV/requirements.txt
if ! cmp -s interop/requirements.txt "$STAMP" 2>/dev/null; then
  echo "interop-tools: installing interop/requirements.txt into $VENV" >&2
  mkdir -p "$TOOLS"
  if ! python3 -c 'import ensurepip, venv' 2>/dev/null && command -v apt-get >/dev/null; then
    echo "interop-tools: installing python3-venv" >&2
    apt-get update -qq >&2 && apt-get install -y -qq python3-venv >&2
  fi
  python3 -m venv "$VENV" >&2
  "$VENV/bin/pip" install --quiet --disable-pip-version-check -r interop/requirements.txt >&2
  cp interop/requirements.txt "$STAMP"
fi
echo "$VENV/bin/python"
