#!/usr/bin/env bash
# Installs Debian's `chromium` package when no `chromium` is on PATH: the headless browser that
# tests/test_mlflow_ui.py uses to render MLflow's run-comparison page. `make test` calls it each
# time (silent and instant when chromium is there). Needs apt-get and either root or password-less
# sudo; otherwise it says what to run by hand and exits non-zero.
set -euo pipefail

if command -v chromium >/dev/null 2>&1; then
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "install_chromium: no chromium and no apt-get (not Debian/Ubuntu)." >&2
    echo "  Install Chromium so that \`chromium\` is on PATH, then rerun make test." >&2
    exit 1
fi
if [ "$(id -u)" -eq 0 ]; then
    as_root=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    as_root=(sudo -n)
else
    echo "install_chromium: chromium is missing and installing it needs root." >&2
    echo "  Run: sudo apt-get update && sudo apt-get install -y chromium" >&2
    exit 1
fi

export DEBIAN_FRONTEND=noninteractive
apt_get=("${as_root[@]}" apt-get -q -o DPkg::Lock::Timeout=300)
echo "install_chromium: apt-get install chromium (Debian package, about 100 MB)"
if ! "${apt_get[@]}" update || ! "${apt_get[@]}" install -y --no-install-recommends chromium; then
    echo "install_chromium: apt-get could not install chromium (no reachable mirror?)." >&2
    echo "  Check /etc/apt/sources.list* and network access, then rerun make test." >&2
    exit 1
fi
if ! command -v chromium >/dev/null 2>&1; then
    echo "install_chromium: apt-get finished but \`chromium\` is not on PATH." >&2
    exit 1
fi
echo "install_chromium: $(chromium --version 2>/dev/null)"
