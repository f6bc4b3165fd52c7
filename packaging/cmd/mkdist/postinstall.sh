#!/bin/sh
# vllm-guard: after an install or an upgrade (the .deb's postinst, the
# .rpm's %post). Creates the system user the units run as, with its own
# group (or says that an account of that name already exists), gives that
# group the config, then tells systemd about the new units when systemd runs
# this system. A group vllm that is not the package's is never joined: the
# guard's group reads the config (API keys) and uses the control socket, so
# the install says so and what to do, and creates no user. Inside a
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

# entry passwd|group NAME: NAME's line in the system's (or the root's) database.
entry() {
	if [ -n "$root" ]; then
		grep "^$2:" "$root/etc/$1" 2>/dev/null || true
	else
		getent "$1" "$2" || true
	fi
}

# foreign: a group vllm without a user vllm was not made by this package
# (it makes them together): another program's, or people's.
# It is said at the first install and until the config has a group.
config="$root/etc/vllm-guard/vllm-guard.toml"
foreign=no
if ! known passwd vllm && known group vllm; then
	foreign=yes
fi
if [ "$foreign" = yes ] && { [ "$first" = yes ] || [ "$(stat -c %g "$config" 2>/dev/null)" = 0 ]; }; then
	cat >&2 <<EOF
vllm-guard: WARNING: a group vllm already exists ($(entry group vllm)) and is not this package's.
vllm-guard: The guard's group reads /etc/vllm-guard/vllm-guard.toml (it may hold API keys) and
vllm-guard: uses the guard's control socket (restart, status), so the package does not put the
vllm-guard: guard in that group: it created no user vllm, and the config stays root's (0640 root:root).
vllm-guard: vllm-guard.service will not start until you choose one of:
vllm-guard:   - the guard in its own group (other names; set them in a drop-in, systemctl edit vllm-guard):
vllm-guard:       useradd --system --user-group --home-dir /var/lib/vllm-guard --no-create-home --shell /usr/sbin/nologin vllm-guard
vllm-guard:       chgrp vllm-guard /etc/vllm-guard/vllm-guard.toml
vllm-guard:       [Service] User=vllm-guard Group=vllm-guard
vllm-guard:   - or, if every member of group vllm may read the keys and control the guard:
vllm-guard:       useradd --system --gid vllm --home-dir /var/lib/vllm-guard --no-create-home --shell /usr/sbin/nologin vllm
vllm-guard:       chgrp vllm /etc/vllm-guard/vllm-guard.toml
EOF
fi
if [ "$foreign" = yes ]; then
	: # no user: see above
elif ! known passwd vllm; then
	if command -v useradd >/dev/null 2>&1; then
		set -- --system --home-dir /var/lib/vllm-guard --no-create-home --shell /usr/sbin/nologin --user-group
		if [ -n "$root" ]; then set -- --prefix "$root" "$@"; fi
		useradd "$@" vllm
	else
		echo "vllm-guard: no useradd here: create the system user vllm before starting vllm-guard.service" >&2
	fi
elif [ "$first" = yes ]; then
	# Not ours: an account of that name was there before the package. The
	# units run as it and it reads the config; say so, and how to choose.
	echo "vllm-guard: WARNING: the account vllm already exists ($(entry passwd vllm)); vllm-guard.service runs as it, and the members of group vllm ($(entry group vllm)) may read /etc/vllm-guard (API keys) and use the guard's control socket. If it is a person's account or another program's, make a system user for the guard and set User= and Group= in a drop-in (systemctl edit vllm-guard)." >&2
fi

# The config may hold API keys: root writes it, the guard's group reads it.
# The .rpm gives it group vllm by name: taken back from a foreign group.
if [ "$foreign" = yes ]; then
	if [ -f "$config" ] && [ ! -L "$config" ] && [ "$(stat -c %g "$config")" = "$(entry group vllm | cut -d: -f3)" ]; then
		chgrp 0 "$config" && chmod 0640 "$config"
	fi
elif [ -f "$config" ] && [ ! -L "$config" ] && [ "$(stat -c %g "$config")" = 0 ]; then
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
