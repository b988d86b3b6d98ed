#!/usr/bin/env bash
# The dashboard's browser tests drive Debian's chromium (headless) through Playwright's Python
# API with executable_path: Playwright's own browser download is never used. Install the
# package when it is missing (as .ci/run does for redis-server); a no-op when it is there.
set -euo pipefail

if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "chromium is missing: install your distribution's chromium package (the browser tests" \
       "need it; MUTUALRL_CHROMIUM may point at another Chromium binary)" >&2
  exit 1
fi
echo "chromium missing: installing Debian's chromium package"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq chromium >/dev/null
command -v chromium
