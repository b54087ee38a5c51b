#!/bin/sh
# The `postgres` service's start (docker/postgres/Containerfile), like the registry image's
# entrypoint for what compose.yaml uses: on an empty volume, initdb with the superuser
# POSTGRES_USER, its password from POSTGRES_PASSWORD_FILE (scram-sha-256 over the network)
# and the database POSTGRES_DB; then the server on every address of the container, as the
# postgres user. The password file is read on the first start only.
set -eu
: "${POSTGRES_USER:?}" "${POSTGRES_DB:?}" "${PGDATA:?}"
as_postgres() { setpriv --reuid=postgres --regid=postgres --init-groups "$@"; }

mkdir -p "$PGDATA" /run/postgresql
chown postgres:postgres "$PGDATA" /run/postgresql
chmod 700 "$PGDATA"

if [ ! -s "$PGDATA/PG_VERSION" ]; then
  : "${POSTGRES_PASSWORD_FILE:?set POSTGRES_PASSWORD_FILE (the password of the first start)}"
  [ -s "$POSTGRES_PASSWORD_FILE" ] || { echo "yimi-postgres: $POSTGRES_PASSWORD_FILE is empty or missing" >&2; exit 1; }
  pwfile=$(mktemp)
  # initdb reads the first line of the file; the secret may end without a newline.
  head -n 1 "$POSTGRES_PASSWORD_FILE" > "$pwfile"
  chown postgres "$pwfile"
  as_postgres initdb --pgdata="$PGDATA" --username="$POSTGRES_USER" --pwfile="$pwfile" \
    --encoding=UTF8 --locale=C.UTF-8 --auth-local=peer --auth-host=scram-sha-256 >/dev/null
  rm -f "$pwfile"
  # Clients of the compose network come in over TCP, always with the password.
  echo "host all all 0.0.0.0/0 scram-sha-256" >> "$PGDATA/pg_hba.conf"
  echo "CREATE DATABASE \"$POSTGRES_DB\" OWNER \"$POSTGRES_USER\";" \
    | as_postgres postgres --single -D "$PGDATA" -j postgres >/dev/null
  echo "yimi-postgres: initialised $PGDATA (user $POSTGRES_USER, database $POSTGRES_DB)"
fi
exec setpriv --reuid=postgres --regid=postgres --init-groups postgres -D "$PGDATA" -c listen_addresses='*'
