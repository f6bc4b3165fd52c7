#!/bin/sh
# vllm-guard: after an install or an upgrade (the .deb's postinst, the
# .rpm's %post). Creates the system user the units run as (or says that an
# account of that name already exists), gives its group the config, then
# tells systemd about the new units when systemd runs this system. Inside a
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

# first: the .deb's "configure" with no version before it, the .rpm's
# first install (1); an upgrade passes the old version, or 2 and more.
first=no
case "$1:${2:-}" in
configure: | 1:) first=yes ;;
esac

if ! known passwd vllm; then
	if command -v useradd >/dev/null 2>&1; then
		set -- --system --home-dir /var/lib/vllm-guard --no-create-home --shell /usr/sbin/nologin
		if [ -n "$root" ]; then set -- --prefix "$root" "$@"; fi
		if known group vllm; then set -- "$@" --gid vllm; else set -- "$@" --user-group; fi
		useradd "$@" vllm
	else
		echo "vllm-guard: no useradd here: create the system user vllm before starting vllm-guard.service" >&2
	fi
elif [ "$first" = yes ]; then
	# Not ours: an account of that name was there before the package. The
	# units run as it and it reads the config; say so, and how to choose.
	if [ -n "$root" ]; then
		entry=$(grep "^vllm:" "$root/etc/passwd" 2>/dev/null || true)
	else
		entry=$(getent passwd vllm || true)
	fi
	echo "vllm-guard: the account vllm already exists ($entry); vllm-guard.service runs as it and its group may read /etc/vllm-guard. If it is a person's account or another program's, make a system user for the guard and set User= and Group= in a drop-in (systemctl edit vllm-guard)." >&2
fi

# The config may hold API keys: root writes it, the guard's group reads it.
config="$root/etc/vllm-guard/vllm-guard.toml"
if [ -f "$config" ] && [ ! -L "$config" ] && [ "$(stat -c %g "$config")" = 0 ]; then
	if [ -n "$root" ]; then
		gid=$(grep "^vllm:" "$root/etc/group" 2>/dev/null | cut -d: -f3)
	else
		gid=$(getent group vllm | cut -d: -f3)
	fi
	if [ -n "$gid" ]; then
		chgrp "$gid" "$config" && chmod 0640 "$config"
	else
		echo "vllm-guard: no group vllm: let the guard's user read $config (chgrp GROUP $config)" >&2
	fi
fi

if [ -z "$root" ] && [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
	systemctl daemon-reload || echo "vllm-guard: systemctl daemon-reload failed: run it before starting vllm-guard.service" >&2
fi
exit 0
