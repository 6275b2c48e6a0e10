#!/bin/sh
# Entrypoint of the PostgreSQL image that build-image.sh makes. It honours
# the contract pgtest relies on from the official postgres image:
# POSTGRES_PASSWORD (required), POSTGRES_USER (default postgres),
# POSTGRES_DB (default: the user's name); a fresh cluster in PGDATA on
# first start; the server listens on 5432 on every address, with password
# (SCRAM) authentication over TCP.
set -eu
: "${POSTGRES_PASSWORD:?POSTGRES_PASSWORD must be set}"
user=${POSTGRES_USER:-postgres}
db=${POSTGRES_DB:-$user}
PGDATA=${PGDATA:-/var/lib/postgresql/data}
bin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
as_postgres() { setpriv --reuid=postgres --regid=postgres --init-groups "$@"; }

if [ ! -s "$PGDATA/PG_VERSION" ]; then
	mkdir -p "$PGDATA" /var/run/postgresql
	chown postgres:postgres "$PGDATA" /var/run/postgresql
	chmod 700 "$PGDATA"
	pw=$(mktemp)
	printf '%s\n' "$POSTGRES_PASSWORD" > "$pw"
	chown postgres "$pw"
	as_postgres "$bin/initdb" -D "$PGDATA" -U "$user" -E UTF8 --locale=C.UTF-8 \
		--auth-local=trust --auth-host=scram-sha-256 --pwfile="$pw" >/dev/null
	rm -f "$pw"
	echo "host all all all scram-sha-256" >> "$PGDATA/pg_hba.conf"
	if [ "$db" != postgres ]; then
		echo "CREATE DATABASE \"$db\" OWNER \"$user\"" | as_postgres "$bin/postgres" --single -D "$PGDATA" postgres >/dev/null
	fi
fi
exec setpriv --reuid=postgres --regid=postgres --init-groups "$bin/postgres" -D "$PGDATA" -c listen_addresses='*' -p 5432 "$@"
