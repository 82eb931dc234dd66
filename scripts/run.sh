#!/usr/bin/env bash
# `make run`: create the default datastore with one thin disk, then serve it.
set -euo pipefail
STRATA=${STRATA:-target/release/strata}
DATASTORE=${DATASTORE:-run/datastore}
NBD_SOCK=${NBD_SOCK:-run/nbd.sock}
NBD_TCP=${NBD_TCP:-127.0.0.1:10809}
HTTP=${HTTP:-127.0.0.1:9100}
TOKEN_FILE=${TOKEN_FILE:-$(dirname "$NBD_SOCK")/http.token}
export STRATA_DATASTORE="$DATASTORE"
mkdir -p "$(dirname "$NBD_SOCK")"
if [ ! -e "$DATASTORE/strata.super" ]; then
  "$STRATA" init
  "$STRATA" create disk0 --size 10G --type thin >/dev/null
  echo "created disk0 (10 GiB, thin) in $DATASTORE"
fi
# The dashboard's actions need a token: made once (0600), kept in run/.
if [ ! -s "$TOKEN_FILE" ]; then
  (umask 077; od -An -tx1 -N32 /dev/urandom | tr -d ' \n' > "$TOKEN_FILE"; echo >> "$TOKEN_FILE")
fi
echo "Dashboard: http://$HTTP/#token=$(tr -d '\n' < "$TOKEN_FILE")"
echo "  (read-only without the token: http://$HTTP/ ; API: http://$HTTP/api/v1, docs/API.md)"
echo "In another terminal (commands reach the running server):"
echo "  export STRATA_DATASTORE=$DATASTORE"
echo "  $STRATA list"
echo "  $STRATA snapshot create disk0 snap1"
echo "  $STRATA clone disk0@snap1 vm2"
echo "  $STRATA stats disk0 --watch"
exec "$STRATA" serve --nbd-unix "$NBD_SOCK" --nbd-tcp "$NBD_TCP" --http "$HTTP" --http-token "$TOKEN_FILE"
