#!/bin/sh
# A worker outside Rust on oncebox's durable inbox: runs take_batch.sql until it finds
# nothing left. Start as many as you like; each row is processed once.
#
#   worker.sh DATABASE_URL SCHEMA CONSUMER
set -eu
here=$(dirname "$0")
while :; do
  processed=$(psql "$1" -X -q -A -t -v ON_ERROR_STOP=1 -v schema="$2" -v consumer="$3" \
    -f "$here/take_batch.sql")
  [ "$processed" = 0 ] && exit 0
done
