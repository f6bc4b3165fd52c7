#!/usr/bin/env bash
# Installs what the tests need beyond Go and gcc, from Debian's packages.
# Safe to run again: it installs only what is missing.
set -euo pipefail
need=()
command -v gcc >/dev/null || need+=(gcc)
command -v setsid >/dev/null || need+=(util-linux)
command -v systemd-analyze >/dev/null || need+=(systemd)     # examples: verify the unit
{ command -v promtool && command -v prometheus; } >/dev/null || need+=(prometheus)  # examples: the alert rules (promtool); integration: a live server
command -v zsh >/dev/null || need+=(zsh)                     # cmd: parse and run the zsh completion
command -v rpm >/dev/null || need+=(rpm)                     # packaging: read the .rpm (rpm -qp)
command -v groff >/dev/null || need+=(groff-base)            # packaging: render the man page
command -v man >/dev/null || need+=(man-db)                  # packaging: man -l reads the man page
command -v useradd >/dev/null || need+=(passwd)              # packaging: the postinstall adds the user
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "setup: missing ${need[*]}: install them (apt-get install ${need[*]}) or run as root" >&2
    exit 1
  fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
go mod download
(cd packaging && go mod download)
(cd examples/helm && go mod download)                   # the Helm chart's own module
