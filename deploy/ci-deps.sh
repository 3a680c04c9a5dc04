#!/usr/bin/env bash
# Installs what deploy/test.sh needs on Debian, with the rest of what the whole test
# run needs: scripts/deps.sh, which scripts/test.sh runs first. Run as root to install;
# as another user it prints what to install.
exec "$(dirname "$0")/../scripts/deps.sh" "$@"
