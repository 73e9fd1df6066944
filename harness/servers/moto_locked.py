"""moto_server behind one lock, for the charge-once tests.

Stock moto_server serves requests on several threads without isolating DynamoDB
conditional writes, so two concurrent UpdateItems with the same condition can both
win. Real DynamoDB never allows that; serialising every request restores the
guarantee the idempotency table depends on.

Binds 127.0.0.1 on a free port (or `--port N`), prints `PORT=<n>` on stdout, and exits
when its stdin closes (the test process that started it ended). `--detached` (for
`make watch`, started in the background) does not watch stdin.

moto reads an event bus named in a request as the last `/`-separated part of what was
sent, so a partner event bus (AWS names it after its event source:
`aws.partner/stripe.com/ed_…`) can hold no rule and receive no event. Here the name is
read as AWS reads it: what follows `event-bus/` in an ARN, else the whole name.
"""

import argparse

import os
import sys
import threading

from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
from werkzeug.serving import make_server


def read_event_bus_names_as_aws() -> None:
    from moto.events.models import EventsBackend

    def normalize(self, name_or_arn):
        if name_or_arn is None:
            return "default"
        if name_or_arn.startswith("arn:"):
            return name_or_arn.split(":event-bus/", 1)[-1]
        return name_or_arn

    EventsBackend._normalize_event_bus_arn = normalize


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--detached", action="store_true")
    args = parser.parse_args()
    read_event_bus_names_as_aws()
    app = DomainDispatcherApplication(create_backend_app)
    lock = threading.Lock()

    def locked(environ, start_response):
        with lock:
            # Consume the whole response inside the lock: the write happens lazily.
            return list(app(environ, start_response))

    server = make_server("127.0.0.1", args.port, locked, threaded=True)
    print(f"PORT={server.server_port}", flush=True)

    def exit_when_parent_ends() -> None:
        sys.stdin.read()
        os._exit(0)

    if not args.detached:
        threading.Thread(target=exit_when_parent_ends, daemon=True).start()
    server.serve_forever()


if __name__ == "__main__":
    main()
