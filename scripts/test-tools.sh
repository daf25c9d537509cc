#!/usr/bin/env sh
# The system tools two tests drive, installed from Debian's packages when they are missing:
# Chromium (tests/e2e/test_dashboard.py) and promtool (tests/unit/test_alerts.py). Where
# apt-get cannot run (not Debian, not root), nothing is installed here and those tests fail
# with one line naming what to install.
set -u
missing=""
command -v chromium >/dev/null 2>&1 || missing="$missing chromium"
command -v promtool >/dev/null 2>&1 || missing="$missing prometheus"
[ -z "$missing" ] && exit 0
if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    echo "installing from Debian's packages:$missing"
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -qq --no-install-recommends $missing) || true
else
    echo "not installed (apt-get as root is not available):$missing; the tests that drive them will say so"
fi
exit 0
