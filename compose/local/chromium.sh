#!/usr/bin/env bash
# chromium.sh - install Debian's chromium, the headless browser the web
# console's browser tests drive (console/browser_test.go, with chromedp),
# when it is missing; `make test` runs it. Idempotent; prints the
# browser's path. The tests run it with --no-sandbox (CI runs as root).
set -euo pipefail
if p=$(command -v chromium 2>/dev/null); then
	echo "$p"
	exit 0
fi
sudo=""
if [ "$(id -u)" != 0 ]; then
	command -v sudo >/dev/null || { echo "chromium.sh: need root (or sudo) to install chromium" >&2; exit 1; }
	sudo=sudo
fi
echo "chromium.sh: installing Debian package chromium" >&2
$sudo env DEBIAN_FRONTEND=noninteractive apt-get update -q </dev/null >&2
$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium </dev/null >&2
command -v chromium
