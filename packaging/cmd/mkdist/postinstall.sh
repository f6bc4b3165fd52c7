#!/bin/sh
# vllm-guard: after an install or an upgrade (the .deb's postinst, the
# .rpm's %post). Creates the system user the units run as, then tells
# systemd about the new units when systemd runs this system. Inside a
# chroot, an image build or a root being filled without one (dpkg --root
# --force-script-chrootless sets DPKG_ROOT), nothing here talks to a
# running system.
set -e

root="${DPKG_ROOT:-}"

# known passwd|group NAME: is NAME in the system's (or the root's) database?
known() {
	if [ -n "$root" ]; then
		grep -q "^$2:" "$root/etc/$1" 2>/dev/null
	else
		getent "$1" "$2" >/dev/null 2>&1
	fi
}

if ! known passwd vllm; then
	if command -v useradd >/dev/null 2>&1; then
		set -- --system --home-dir /var/lib/vllm-guard --no-create-home --shell /usr/sbin/nologin
		if [ -n "$root" ]; then set -- --prefix "$root" "$@"; fi
		if known group vllm; then set -- "$@" --gid vllm; else set -- "$@" --user-group; fi
		useradd "$@" vllm
	else
		echo "vllm-guard: no useradd here: create the system user vllm before starting vllm-guard.service" >&2
	fi
fi

if [ -z "$root" ] && [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
	systemctl daemon-reload || echo "vllm-guard: systemctl daemon-reload failed: run it before starting vllm-guard.service" >&2
fi
exit 0
