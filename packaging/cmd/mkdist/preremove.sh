#!/bin/sh
# vllm-guard: before the package's files go (the .deb's prerm, the .rpm's
# %preun). On removal, not on an upgrade, stops and disables the guards
# (vLLM stops with them: the guard stops its process tree) while their
# binary still exists. In a chroot, an image build or a root filled
# without one (DPKG_ROOT), nothing here talks to a running system.
set -e

root="${DPKG_ROOT:-}"

# Removal: the .deb's "remove" (dpkg runs prerm once, before a purge too),
# the .rpm's 0 (no version left). An upgrade ("upgrade", 1) keeps them
# running; the new package's postinstall reloads systemd.
case "$1" in
remove | 0) ;;
*) exit 0 ;;
esac

if [ -z "$root" ] && [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
	systemctl --no-reload disable --now vllm-guard.service ||
		echo "vllm-guard: could not stop vllm-guard.service: stop it (systemctl stop vllm-guard) before its binary is gone" >&2
	systemctl stop 'vllm-guard@*.service' ||
		echo "vllm-guard: could not stop the vllm-guard@ instances: stop them (systemctl stop 'vllm-guard@*')" >&2
fi
exit 0
