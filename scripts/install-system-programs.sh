#!/usr/bin/env bash
# The system programs the test suite starts or drives for real: installs the missing ones with
# apt-get (as root, or through passwordless sudo), else says in one line what to install.
# `make test` runs it before pytest, `make install` for npm alone (`$0 npm`); it does nothing
# when everything asked for is present. Arguments: the packages to check (default: all).
#   redis-server  the Responses store (tests/support/redis_server.py)
#   prometheus    the dashboards' queries and promtool (tests/deploy)
#   tmux          `helios dashboard` in a terminal (tests/dashboard)
#   npm           tokenizer assets and the JavaScript SDK tests
#   chromium      CORS from a real browser page (tests/gateway)
set -uo pipefail

wanted=" ${*:-redis-server prometheus tmux npm chromium} "
missing=()
need() {  # need <package> <command>...: the package is missing when none of the commands is
  local package=$1
  shift
  [[ "$wanted" == *" $package "* ]] || return 0
  for command in "$@"; do
    command -v "$command" >/dev/null 2>&1 && return 0
  done
  missing+=("$package")
}
need redis-server redis-server
need prometheus prometheus
need tmux tmux
need npm npm
need chromium chromium chromium-browser google-chrome

[ ${#missing[@]} -eq 0 ] && exit 0

sudo=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1 && sudo -n true >/dev/null 2>&1; then
    sudo="sudo"
  else
    sudo="unavailable"
  fi
fi
if [ "$sudo" = "unavailable" ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "make test needs these system programs: ${missing[*]} (Debian/Ubuntu: sudo apt-get install -y ${missing[*]})" >&2
  exit 1
fi

echo "installing system programs for the tests: ${missing[*]}" >&2
$sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
