#!/usr/bin/env bash
# build-image.sh [TAG [SUITE]] builds a PostgreSQL image with no container
# registry: a Debian root file system made by debootstrap from the mirror
# this machine's apt already uses, with Debian's postgresql package and
# entrypoint.sh, imported with `docker import`. TAG defaults to
# sqllock-postgres:local; SUITE to the suite apt uses here. Each suite
# carries one PostgreSQL major: bullseye 13, bookworm 15, trixie 17, sid 18.
# It needs root, a Docker engine and network access to that mirror; it
# caches nothing (about 2 to 4 minutes).
#
#	bash pgtest/docker/build-image.sh sqllock-postgres:17 trixie
set -euo pipefail
tag=${1:-sqllock-postgres:local}
want_suite=${2:-}
here=$(cd "$(dirname "$0")" && pwd)

# The mirror and suite apt uses here (deb822 or one-line sources).
mirror= suite=
if [ -f /etc/apt/sources.list.d/debian.sources ]; then
	mirror=$(awk '/^URIs:/ && $2 !~ /security/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources)
	suite=$(awk '/^Suites:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources)
fi
if [ -z "$mirror" ] && [ -f /etc/apt/sources.list ]; then
	read -r mirror suite < <(awk '$1 == "deb" && $0 !~ /security/ {print $2, $3; exit}' /etc/apt/sources.list)
fi
[ -n "$mirror" ] && [ -n "$suite" ] || { echo "build-image.sh: no Debian mirror in the apt configuration" >&2; exit 1; }
[ -z "$want_suite" ] || suite=$want_suite

if ! command -v debootstrap >/dev/null; then
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
fi

root=$(mktemp -d /var/tmp/sqllock-image-XXXXXX)
trap 'rm -rf "$root"' EXIT
start=$(date +%s)
debootstrap --variant=minbase --include=postgresql "$suite" "$root" "$mirror" >"$root.log" 2>&1 ||
	{ tail -n 30 "$root.log" >&2; rm -f "$root.log"; exit 1; }
rm -f "$root.log"
# A fresh cluster comes from the entrypoint, not from the package.
rm -rf "$root"/var/lib/postgresql/* "$root"/etc/postgresql/* "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
install -m 0755 "$here/entrypoint.sh" "$root/usr/local/bin/docker-entrypoint.sh"
tar -C "$root" -c . | docker import \
	--change 'ENTRYPOINT ["/usr/local/bin/docker-entrypoint.sh"]' \
	--change 'EXPOSE 5432' \
	--change 'ENV LANG=C.UTF-8' \
	- "$tag" >/dev/null
echo "build-image.sh: built $tag from Debian $suite in $(( $(date +%s) - start ))s"
