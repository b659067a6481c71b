#!/usr/bin/env bash
# Refresh the lock: resolve pyproject.toml's dependencies (every extra together, for every platform, newest versions
# within the declared ranges) with uv, then export the pinned, hash-checked requirement files the set-up installs:
# lock/dev.txt (gleak, its dev tools and the text extra: make demo, the fast suite) and lock/all.txt (also docs,
# flower, nvflare, ray: make test, CI). uv's own uv.lock stays out of the repository: it names the index's hosts, the exports do not.
# --check: resolve again without upgrading and fail if the exports would change (pyproject.toml edited, lock not).
set -euo pipefail
cd "$(dirname "$0")/.."
UV="$(command -v uv || echo "python3 -m uv")"
check=false
if [ "${1:-}" = "--check" ]; then check=true; fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if $check; then
    # the versions already locked are preferred (uv keeps a lock's pins unless they no longer fit pyproject.toml)
    grep -E '^[A-Za-z0-9_.-]+==' lock/all.txt | sed 's/ *\\$//' > "$work/pins.txt"
    $UV pip compile -q --universal --python-version 3.11 --all-extras pyproject.toml -c "$work/pins.txt" \
        -o "$work/resolved.txt" --no-header
    grep -E '^[A-Za-z0-9_.-]+==' "$work/resolved.txt" | sed 's/ *\\$//' | sort -u > "$work/new.txt"
    sort -u "$work/pins.txt" > "$work/old.txt"
    if ! diff -u "$work/old.txt" "$work/new.txt"; then
        echo "error: lock/all.txt does not match pyproject.toml; run 'make lock'" >&2
        exit 1
    fi
    echo "lock/all.txt matches pyproject.toml ($(wc -l < "$work/old.txt") pinned packages)"
    exit 0
fi
$UV lock -q --upgrade
$UV export -q --frozen --no-emit-project --extra dev --extra text -o lock/dev.txt
$UV export -q --frozen --no-emit-project --all-extras -o lock/all.txt
echo "lock/dev.txt: $(grep -cE '^[A-Za-z0-9_.-]+==' lock/dev.txt) packages; lock/all.txt: $(grep -cE '^[A-Za-z0-9_.-]+==' lock/all.txt)"
