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

moto counts a message's body alone against its queue's MaximumMessageSize; SQS counts
its attributes too. Here they count, so a message SQS would refuse is refused.
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


def count_attributes_in_message_size() -> None:
    """SQS counts a message's attributes (name, type and value) in its size against the
    queue's MaximumMessageSize; moto counts the body alone. Here the attributes count,
    and a message over the size is refused as SQS refuses it."""
    from moto.sqs.exceptions import InvalidParameterValue
    from moto.sqs.models import SQSBackend

    send = SQSBackend.send_message

    def size_of(attributes) -> int:
        total = 0
        for name, value in (attributes or {}).items():
            total += len(name.encode())
            if isinstance(value, dict):
                for field in value.values():
                    if isinstance(field, (str, bytes)):
                        total += len(field if isinstance(field, bytes) else field.encode())
        return total

    def send_counting_attributes(self, queue_name, message_body, message_attributes=None,
                                 *args, **kwargs):
        queue = self.get_queue(queue_name)
        size = len(message_body.encode()) + size_of(message_attributes)
        if size > queue.maximum_message_size:
            raise InvalidParameterValue(
                "One or more parameters are invalid. Reason: Message must be shorter "
                f"than {queue.maximum_message_size} bytes."
            )
        return send(self, queue_name, message_body, message_attributes, *args, **kwargs)

    SQSBackend.send_message = send_counting_attributes


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--detached", action="store_true")
    args = parser.parse_args()
    read_event_bus_names_as_aws()
    count_attributes_in_message_size()
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
