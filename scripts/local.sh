#!/usr/bin/env bash
# Local servers for `make watch` / `make invoke`: moto (behind its lock) and
# localstripe (behind its layer, with the test PaymentMethod ids events/ names) on fixed
# 127.0.0.1 ports, an idempotency table, a dead-letter queue, and the customers the
# events/ files use. `scripts/local.sh up|down|env`.
set -euo pipefail
cd "$(dirname "$0")/.."

MOTO_PORT=${MOTO_PORT:-5005}
STRIPE_PORT=${STRIPE_PORT:-12111}
TABLE=${TABLE:-charge-once-local}
STATE=.local/servers
mkdir -p "$STATE"

wait_port() { # port name
  for _ in $(seq 1 100); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then return 0; fi
    sleep 0.1
  done
  echo "$2 did not start on 127.0.0.1:$1; see $STATE/$2.log" >&2
  exit 1
}

running() { [ -f "$STATE/$1.pid" ] && kill -0 "$(cat "$STATE/$1.pid")" 2>/dev/null; }

env_file() {
  cat <<ENV
AWS_REGION=us-east-1
AWS_ACCESS_KEY_ID=test
AWS_SECRET_ACCESS_KEY=test
AWS_ENDPOINT_URL=http://127.0.0.1:$MOTO_PORT
IDEMPOTENCY_TABLE=$TABLE
PAYMENT_API_URL=http://127.0.0.1:$STRIPE_PORT
PAYMENT_API_KEY=sk_test_local
DEAD_LETTER_QUEUE_URL=http://127.0.0.1:$MOTO_PORT/123456789012/charge-once-local-dlq
ENV
}

case "${1:-}" in
  up)
    if ! running moto; then
      nohup .venv/bin/python harness/servers/moto_locked.py --port "$MOTO_PORT" --detached \
        >"$STATE/moto.log" 2>&1 </dev/null &
      echo $! >"$STATE/moto.pid"
    fi
    if ! running stripe; then
      nohup .venv/bin/python harness/servers/localstripe_server.py --port "$STRIPE_PORT" \
        --detached --local >"$STATE/stripe.log" 2>&1 </dev/null &
      echo $! >"$STATE/stripe.pid"
    fi
    wait_port "$MOTO_PORT" moto
    wait_port "$STRIPE_PORT" stripe
    env_file >.local/env
    .venv/bin/python scripts/local_setup.py "http://127.0.0.1:$MOTO_PORT" "$TABLE" \
      "http://127.0.0.1:$STRIPE_PORT"
    echo "moto on :$MOTO_PORT, localstripe on :$STRIPE_PORT, table $TABLE; settings in .local/env"
    ;;
  down)
    for name in moto stripe; do
      if running "$name"; then kill "$(cat "$STATE/$name.pid")"; fi
      rm -f "$STATE/$name.pid"
    done
    ;;
  env)
    env_file
    ;;
  *)
    echo "usage: scripts/local.sh up|down|env" >&2
    exit 2
    ;;
esac
