# shellcheck shell=bash
# Sourced by scripts/test and scripts/demo: cd to the repository root and make sure .venv holds
# zettelq with its dev extra, (re)installing when the venv is new or pyproject.toml changed.

cd "$(dirname "${BASH_SOURCE[0]}")/.."

if ! python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    echo "error: zettelq needs python3 at version 3.11 or newer on PATH" >&2
    exit 1
fi

if [[ ! -x .venv/bin/python ]]; then
    if ! python3 -m venv .venv; then
        rm -rf .venv
        echo "error: 'python3 -m venv' failed; on Debian/Ubuntu install the venv module with:" >&2
        echo "    sudo apt-get install python3-venv" >&2
        exit 1
    fi
fi

if [[ ! -f .venv/.zq-installed || pyproject.toml -nt .venv/.zq-installed ]]; then
    echo "Installing zettelq and its dev dependencies into .venv ..." >&2
    .venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[dev]'
    touch .venv/.zq-installed
fi
