#!/usr/bin/env bash
# Install headless Chromium, its WebDriver and a font (Debian packages chromium, chromium-driver,
# fonts-liberation) for the browser test of report.html (tests/test_report_browser.py).
# Does nothing when chromium and chromedriver are already installed.
# Needs root, or sudo; fails (non-zero) when neither is available or the install fails.
set -euo pipefail
if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" -eq 0 ]; then
    SUDO=()
elif command -v sudo >/dev/null 2>&1; then
    SUDO=(sudo)
else
    echo "install-chromium: chromium is missing and installing it needs root or sudo" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
echo "install-chromium: installing chromium and chromium-driver" >&2
log=$(mktemp)
trap 'rm -f "$log"' EXIT
if ! { "${SUDO[@]}" apt-get update -qq && "${SUDO[@]}" apt-get install -y -qq --no-install-recommends \
        chromium chromium-driver fonts-liberation; } >"$log" 2>&1; then
    cat "$log" >&2
    echo "install-chromium: apt-get failed" >&2
    exit 1
fi
command -v chromium >/dev/null && command -v chromedriver >/dev/null
