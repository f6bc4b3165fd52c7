#!/bin/sh
# vllm-guard: after the package's files are gone or replaced (the .deb's
# postrm, the .rpm's %postun). Tells systemd that the units changed or are
# gone, so it does not keep the removed ones loaded. In a chroot, an image
# build or a root filled without one (DPKG_ROOT), nothing here talks to a
# running system.
set -e

root="${DPKG_ROOT:-}"

if [ -z "$root" ] && [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
	systemctl daemon-reload || echo "vllm-guard: systemctl daemon-reload failed: run it" >&2
fi
exit 0
