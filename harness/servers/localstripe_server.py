"""localstripe for the charge-once tests, with the layer that gives it what Stripe has
and it lacks.

localstripe (PyPI) serves PaymentIntents, PaymentMethods and Stripe's test cards, but:

* it has no `Idempotency-Key`: the layer below stores the first answer per key, the way
  Stripe documents it (docs.stripe.com/api/idempotent_requests), and replays it;
* its `GET /v1/payment_intents` refuses `customer` and `created` (`created[gte]` and
  the other bounds): both filters are added to its list, before the page is cut, as
  localstripe's own charge list has them;
* its PaymentIntents refuse `description` and `automatic_payment_methods`, and drop
  `payment_method_options`: the layer keeps all three on the object as sent (`enabled` read as a boolean, as Stripe answers it),
  and takes a confirm's `return_url` (kept nowhere: localstripe follows no redirect);
* its 404 for an object it does not hold names no code: the layer adds Stripe's
  `resource_missing` (a path that reaches no endpoint keeps its plain 404);
* its 402 for a declined PaymentIntent names only the charge: the layer adds the
  PaymentIntent the decline left `requires_payment_method` (`error.payment_intent`,
  the object, as Stripe names it);
* it binds every interface: this runs it on 127.0.0.1 only;
* it writes its whole store to /tmp/localstripe.pickle on every change and reads it
  back at start: here the store lives in memory only, one per process.

Every other answer is localstripe's own: among them `GET /v1/events` (`type` and
`created[gte]` filters, paged), which holds a `payment_intent.succeeded` event for
every PaymentIntent that succeeds, at its create's confirm or at the customer's
`_authenticate` (what the audit reads for late confirmations). Binds 127.0.0.1 on a free port (or `--port
N`), prints `PORT=<n>` on stdout, and exits when its stdin closes (the test process
that started it ended). `--detached` (for `make watch`, started in the background)
does not watch stdin; `--local` adds what `events/` names: Stripe's test
PaymentMethod ids `pm_card_chargeDeclined` and `pm_card_authenticationRequired`, and
customers created with a given `id`.

The idempotency layer:

* A POST with `Idempotency-Key` is looked up by (API key, idempotency key). The first
  answer is stored (status and body) and replayed to every later request with the same
  key, with `Idempotent-Replayed: true`. Answers that no endpoint produced are not
  stored, so they can be retried: 401 (the API key) and 429, as in stripe-stateful-mock.
  5xx are stored, as Stripe documents.
* The same key with another path or other parameters (query or form body): 400,
  `idempotency_error`; the stored answer stays.
* The same key while its first request is still being answered: 409,
  `idempotency_key_in_use`, nothing stored. localstripe answers a request without
  yielding to another one, so a test holds a request in flight on purpose: a keyed POST
  that also carries `Layer-Hold: <name>` waits, once its key is taken, until `DELETE
  /_layer/holds/<name>` (at most HOLD_SECONDS); `GET /_layer/holds/<name>` answers once
  it waits.
* `GET /_layer/versions/<idempotency key>` lists the `Stripe-Version` header of every
  keyed POST that came under that key, in order (`""`: none): what reached the server.

Stripe's rules, always on (Stripe always applies them):

* A `POST /v1/payment_intents` with `confirm=true` and none of `payment_method_types`,
  `automatic_payment_methods[allow_redirects]=never` or a `return_url` is refused
  with Stripe's 400 (`invalid_request_error`, its message: "... you must provide a
  `return_url` ..."): since 2023-08-16 such a PaymentIntent accepts the Dashboard's
  methods, some of which redirect.
* Under `Stripe-Version` 2026-09-30.endive or later, any `payment_method_types` on a
  PaymentIntent request is refused: 400, `payment_method_types_no_longer_supported`
  (endive removed the parameter; the message is the layer's).
* A create (`POST /v1/payment_intents`) naming a parameter Stripe does not declare
  for the request's version is refused with Stripe's 400 `parameter_unknown`
  ("Received unknown parameter: …"): the create's parameters and the card's options
  (`CREATE_PARAMETERS`, `CARD_OPTIONS`, from Stripe's API reference), of which
  `payment_method_options[card][stored_credential_usage]` is declared from
  2026-10-28.endive on (before, only in a preview version), with the values
  `unscheduled`, `recurring` and `installment` (another: 400).
* A list of PaymentIntents or of events, a retrieve or a cancel naming a parameter
  Stripe does not declare for it (`DECLARED`) is refused the same way.
* A refund (`POST /v1/refunds`) takes at most what remains of its charge, and
  without `amount` what remains: one of a charge already refunded is refused (400,
  `charge_already_refunded`), one above what remains (400, `param: amount`), and one
  of a PaymentIntent that has not succeeded (400); `reason` is taken and kept; the
  refund list takes `created` (as the PaymentIntent list does); the
  refunds of a PaymentIntent without a charge are an empty list
  (`add_refund_rules`; localstripe refunds any amount, the whole charge by default,
  refuses `reason`, and fails that list).
* A request without `Stripe-Version` is read at the account's default version, the
  latest for an account made today (`ACCOUNT_VERSION`).
* Every refusal above is validation, which reaches no endpoint: nothing is stored under the
  request's idempotency key (Stripe, docs.stripe.com/api/idempotent_requests: results
  are saved only once an endpoint begins). The same request under the same key is
  refused again by the rule, never replayed; a corrected one, under that key or
  another, is answered as new. A key that already holds an answer replays it (or
  refuses other parameters) before any rule, as Stripe compares keys first.

What a test drives:

* `GET /_layer/requests` lists every request that reached the layer (but its own
  `/_layer/` ones), oldest first, the last REQUEST_LOG_SIZE: `method`, `path`, `query`
  (as sent), `stripe_version` (`""`: none) and `idempotency_key` (null: none);
  `?path=<path>` keeps those to one path.
* `POST /_layer/seed` with JSON `{"customer": "cus_…", "count": N, "created":
  <seconds>, "amount": <optional, 1000>}` makes N PaymentIntents of that customer in
  localstripe's store directly, created at that time, in `eur`,
  `requires_payment_method`, `metadata[order_id]` = `seed-<customer>-<n>`: a
  customer's earlier payments, without N requests.
* `POST /_layer/refunds/pending` with JSON `{"key": <idempotency key>}` leaves the
  refund created under that key `pending` (as a bank holds some refunds); `POST
  /_layer/refunds/<id>/settle` with `{"status": "succeeded"}` or `{"status": "failed",
  "failure_reason": <Stripe's reason>}` settles it later (answers 204). A failed
  refund no longer counts against what remains of its charge.
* `POST /_layer/faults` with JSON `{"key": <idempotency key>, "fault": <fault>,
  "after_s": <seconds, up to MAX_HIDDEN_S>}` (answers 204) arms a fault for the next
  `POST /v1/payment_intents` or `POST /v1/refunds` that is the first under that key (a key that already holds
  an answer replays it; a request a rule refuses leaves the fault armed):
  * `server_error`: the answer is Stripe's 500 (`api_error`), stored under the key and
    replayed with `Idempotent-Replayed: true`; localstripe never sees the request, so
    no payment is made.
  * `server_error_rolls_forward`: localstripe makes the payment as usual (a card that
    charges leaves it `succeeded`), but the answer is the same stored 500, and the
    PaymentIntent is left out of every list and answers 404 `resource_missing` to any
    `/v1/payment_intents/<id>…` for `after_s` seconds; then it appears as made. A
    create localstripe refused makes nothing to roll forward.

Stripe's events on EventBridge (docs.stripe.com/event-destinations, type
`amazon_eventbridge`), off until a test arms a destination. localstripe makes Stripe's
`Event` objects for `payment_intent.succeeded` and `.payment_failed` and sends them
only to webhooks; the layer also makes the ones localstripe does not: `.canceled` when
a PaymentIntent is cancelled, and `.payment_failed` when an off-session confirm needs
the customer's authentication (Stripe's 402 `authentication_required`; localstripe
answers `requires_action`, and the event's object says so too, with Stripe's
`last_payment_error`) or when the customer fails it (`_authenticate` with
`success=false`).

* `POST /_layer/eventbridge` with JSON `{"endpoint": <EventBridge URL>, "region",
  "access_key", "secret_key", "bus": <the partner event bus>, "source":
  "aws.partner/stripe.com/ed_test_…", "order_id_prefix": <optional>, "customer":
  <optional>}` adds a destination and answers `{"destination": "<id>"}`. From then on
  every PaymentIntent event (of an order whose `metadata[order_id]` starts with the
  prefix, and of that customer, when they are given: a test's own orders, or some of
  them) is put on that bus with `PutEvents`, signed with that
  key: `Source` the source, `DetailType` the event's type, `Detail` the Stripe Event
  (`data.object` the PaymentIntent as the API answers it at that moment, `metadata`
  included). Each is put EVENT_DELAY_S after the change (asynchronously: the API's
  answer never waits for it; a PaymentIntent a fault hides is put once it shows), and
  tried up to PUT_TRIES times.
* `GET /_layer/eventbridge/<id>` answers `{"published": n, "failed": n, "pending": n,
  "types": {"<type>": n}}`; `DELETE /_layer/eventbridge/<id>` removes the destination.

Stripe's rate limit and customer lock (docs.stripe.com/rate-limits, docs.stripe.com/
error-low-level#lock-timeouts), off until a test turns them on. They run before the
idempotency layer, as Stripe's limiters run first: nothing they refuse is stored under
a key.

* `POST /_layer/limits` with JSON `{"per_endpoint_per_s": R, "lock_ms": L,
  "lock_wait_ms": W}` (each field optional; `{}` turns both off) sets them and zeroes
  the counters; `GET /_layer/limits` answers `{"accepted": {"<endpoint>": n},
  "refused": {"<endpoint>": n}, "locks": n}`. An endpoint is the method and the route,
  ids replaced: `POST /v1/payment_intents`, `GET /v1/payment_intents/:id`, `POST
  /v1/payment_intents/:id/cancel`, ...
* Rate: a token bucket per endpoint, R tokens a second, R at most in the bucket (a
  one-second burst, as Stripe's limiter allows a short one). A request that finds it
  empty gets Stripe's 429 `rate_limit` with `Stripe-Rate-Limited-Reason:
  endpoint-rate`.
* Lock: a create (`POST /v1/payment_intents`) holds its customer for L ms after its
  answer is made, as Stripe holds the customer during a payment. Another request on
  that customer (a create, the list filtered by `customer`, a PaymentIntent of theirs
  by id or its cancel) waits up to W ms for it, then gets Stripe's 429 `lock_timeout`,
  with no `Stripe-Rate-Limited-Reason`.
"""

import argparse
import asyncio
import collections
import contextvars
import json
import os
import socket
import sys
import threading
import time
from dataclasses import dataclass
from urllib.parse import parse_qsl

from aiohttp import web
from localstripe import resources
from localstripe.errors import UserError
from localstripe.resources import PaymentIntent, store
from localstripe.server import app, get_api_key

# A held request goes on by itself after this long, so nothing waits forever.
HOLD_SECONDS = 10.0
# Answers that no endpoint produced (Stripe checks keys and rate limits first).
NOT_STORED = {401, 429}
# How many requests the log keeps, so it stays bounded however long the server runs.
REQUEST_LOG_SIZE = 200_000
# The most PaymentIntents one seeding makes.
MAX_SEEDED = 100_000
# What `POST /_layer/faults` makes of the next create under a key, and the longest a
# payment that rolls forward stays hidden.
FAULTS = {"server_error", "server_error_rolls_forward"}
MAX_HIDDEN_S = 3600.0
# How long after a change its event is put on EventBridge (localstripe's webhooks wait
# 1 s), and how many times a put is tried.
EVENT_DELAY_S = 0.2
PUT_TRIES = 3
# The most destinations a test run arms, so the list stays bounded.
MAX_DESTINATIONS = 1000


def keep_store_in_memory() -> None:
    resources.Store.dump_to_disk = lambda self: None
    resources.Store.try_load_from_disk = lambda self: None


# `created[<op>]=<seconds>` on a list, as Stripe reads it.
CREATED_BOUNDS = {
    "gt": lambda created, bound: created > bound,
    "gte": lambda created, bound: created >= bound,
    "lt": lambda created, bound: created < bound,
    "lte": lambda created, bound: created <= bound,
}


def created_bounds(created) -> list:
    """The `created` filter's bounds: `created=<seconds>` (exactly then) or any of
    `created[gt|gte|lt|lte]=<seconds>`; anything else is refused as Stripe refuses it."""
    if created is None:
        return []
    if isinstance(created, str):
        created = {"eq": created}
    if not isinstance(created, dict) or not created:
        raise UserError(400, "Invalid created")
    bounds = []
    for op, value in created.items():
        if op != "eq" and op not in CREATED_BOUNDS:
            raise UserError(400, f"Invalid created[{op}]")
        try:
            bound = int(value)
        except (TypeError, ValueError):
            raise UserError(400, f"Invalid integer: created[{op}]")
        bounds.append((CREATED_BOUNDS.get(op, lambda c, b: c == b), bound))
    return bounds


def add_list_filters() -> None:
    """`customer` and `created` on the PaymentIntent list, filtered before the page is
    cut, so `limit`, `starting_after` and `has_more` count only what matches.
    localstripe refuses both; they never reach it."""
    list_all = PaymentIntent._api_list_all.__func__

    def list_filtered(cls, url, customer=None, created=None, **kwargs):
        bounds = created_bounds(created)
        page = list_all(cls, url, **kwargs)
        page._list = [
            pi for pi in page._list
            if (customer is None or pi.customer == customer)
            and all(holds(pi.created, bound) for holds, bound in bounds)
            and visible(pi)
        ]
        return page

    PaymentIntent._api_list_all = classmethod(list_filtered)


def add_description() -> None:
    """`description`, `automatic_payment_methods` and `return_url` on a PaymentIntent,
    which Stripe takes and localstripe refuses: the first two kept on the object as
    sent, the last dropped (there is no page to return to); and `payment_method_options`,
    which localstripe takes and drops, kept as sent."""
    init = PaymentIntent.__init__

    def init_with_description(self, description=None, automatic_payment_methods=None,
                              return_url=None, payment_method_options=None, **kwargs):
        # Checked before localstripe's own init, which stores the object.
        automatic = automatic_payment_methods_of(automatic_payment_methods)
        init(self, payment_method_options=payment_method_options, **kwargs)
        self.description = description
        self.automatic_payment_methods = automatic
        # localstripe takes the options and drops them; Stripe shows them as sent.
        self.payment_method_options = payment_method_options or {}

    PaymentIntent.__init__ = init_with_description


def automatic_payment_methods_of(sent) -> dict | None:
    """`automatic_payment_methods[enabled|allow_redirects]` as the object shows it."""
    if sent is None:
        return None
    if not isinstance(sent, dict) or set(sent) - {"enabled", "allow_redirects"}:
        raise UserError(400, "Invalid automatic_payment_methods")
    enabled = str(sent.get("enabled", "")).lower()
    if enabled not in ("true", "false"):
        raise UserError(400, "Invalid boolean: automatic_payment_methods[enabled]")
    redirects = sent.get("allow_redirects", "always")
    if redirects not in ("always", "never"):
        raise UserError(400, "Invalid automatic_payment_methods[allow_redirects]")
    return {"enabled": enabled == "true", "allow_redirects": redirects}


@dataclass
class Stored:
    path: str
    params: dict
    status: int | None = None  # None while the first request is in flight
    body: bytes = b""
    content_type: str = "application/json"


async def missing_object_named(handler, request: web.Request) -> web.StreamResponse:
    """localstripe's answer, with Stripe's `code: resource_missing` on the 404 of an
    object it does not hold (localstripe's 404 names no code). A path that reaches no
    endpoint stays aiohttp's plain-text 404, with no code, as at Stripe."""
    response = await handler(request)
    body = getattr(response, "body", None)
    if response.status != 404 or not isinstance(body, bytes):
        return response
    try:
        error = json.loads(body)["error"]
    except (ValueError, KeyError, TypeError):
        return response
    if not isinstance(error, dict) or "code" in error:
        return response
    return stripe_error(404, {**error, "code": "resource_missing"})


def stripe_error(status: int, error: dict) -> web.Response:
    return web.json_response({"error": error}, status=status)


# The message Stripe answers a confirm that could redirect and says where to return.
RETURN_URL_REQUIRED = (
    "This PaymentIntent is configured to accept payment methods enabled in your "
    "Dashboard. Because some of these payment methods might redirect your customer off "
    "of your page, you must provide a `return_url`. If you don't want to accept "
    "redirect-based payment methods, set `automatic_payment_methods[enabled]` to `true` "
    "and `automatic_payment_methods[allow_redirects]` to `never` when creating Setup "
    "Intents and Payment Intents."
)
# The first version that no longer takes `payment_method_types` (its date; the later
# releases of the same name and the ones after keep the removal).
ENDIVE = "2026-09-30"
# The version of a request that names none: the account's default, which for an account
# made today is the latest (docs.stripe.com/api/versioning).
ACCOUNT_VERSION = "2026-10-28.endive"


# The create's parameters Stripe declares (docs.stripe.com/api/payment_intents/create),
# by their first name; and the card's options (`payment_method_options[card][...]`),
# each with the first version that declares it ("" : every version here).
CREATE_PARAMETERS = {
    "amount", "currency", "application_fee_amount", "automatic_payment_methods",
    "capture_method", "confirm", "confirmation_method", "confirmation_token", "customer",
    "description", "error_on_requires_action", "excluded_payment_method_types", "expand",
    "mandate", "mandate_data", "metadata", "off_session", "on_behalf_of", "payment_method",
    "payment_method_configuration", "payment_method_data", "payment_method_options",
    "payment_method_types", "radar_options", "receipt_email", "return_url",
    "setup_future_usage", "shipping", "statement_descriptor", "statement_descriptor_suffix",
    "transfer_data", "transfer_group", "use_stripe_sdk",
}
CARD_OPTIONS = {
    "capture_method": "", "cvc_token": "", "installments": "", "mandate_options": "",
    "moto": "", "network": "", "request_extended_authorization": "",
    "request_incremental_authorization": "", "request_multicapture": "",
    "request_overcapture": "", "request_three_d_secure": "",
    "require_cvc_recollection": "", "setup_future_usage": "",
    "statement_descriptor_suffix_kana": "", "statement_descriptor_suffix_kanji": "",
    "three_d_secure": "",
    # Card-on-file usage: in 2026-09-30.preview, declared by 2026-10-28.endive
    # (docs.stripe.com/changelog/endive/2026-10-28/card-on-file-usage-indicators-support).
    "setup_credential_usage": "2026-10-28", "stored_credential_usage": "2026-10-28",
}
STORED_CREDENTIAL_USAGES = ("unscheduled", "recurring", "installment")
CARD = "payment_method_options[card]["


# Idempotency keys whose refund is left `pending` (`POST /_layer/refunds/pending`), and
# the key of the request being answered (read by the refund's create).
PENDING_REFUND: dict[str, bool] = {}
CURRENT_KEY: contextvars.ContextVar = contextvars.ContextVar("idempotency_key")

# What a refund's `failure_reason` may be (docs.stripe.com/api/refunds/object).
REFUND_FAILURE_REASONS = ("lost_or_stolen_card", "expired_or_canceled_card",
                          "charge_for_pending_refund_disputed", "insufficient_funds",
                          "declined", "merchant_request", "unknown")


async def refund_control(request: web.Request) -> web.Response:
    """`POST /_layer/refunds/pending` with JSON `{"key": <idempotency key>}`: the
    refund created under that key is left `pending`, as the bank holds it. `POST
    /_layer/refunds/<id>/settle` with JSON `{"status": "succeeded"}` or `{"status":
    "failed", "failure_reason": <Stripe's reason>}`: the bank's answer, later."""
    from localstripe.resources import Refund

    asked = await request.json()
    path = request.path.removeprefix("/_layer/refunds/")
    if path == "pending":
        PENDING_REFUND[str(asked["key"])] = True
        return web.Response(status=204)
    id, _, action = path.partition("/")
    status = asked.get("status")
    reason = asked.get("failure_reason")
    if action != "settle" or status not in ("succeeded", "failed") or (
        status == "failed" and reason not in REFUND_FAILURE_REASONS
    ):
        return web.Response(status=400, text=f"no such refund settling: {path} {asked}")
    refund = Refund._api_retrieve(id)
    if refund.status != "pending":
        return web.Response(status=409, text=f"{id} is {refund.status}, not pending")
    refund.status = status
    refund.failure_reason = reason if status == "failed" else None
    return web.Response(status=204)


# What a refund's `reason` may be (docs.stripe.com/api/refunds/create).
REFUND_REASONS = ("duplicate", "fraudulent", "requested_by_customer")


def add_refund_rules() -> None:
    """Stripe's rules for a refund, where localstripe is kinder
    (docs.stripe.com/api/refunds/create, docs.stripe.com/refunds): a refund takes at
    most what remains of its charge, and without `amount` it takes what remains (not the
    whole charge); a refund of what is already refunded is refused (400,
    `charge_already_refunded`), one above what remains too (400, `amount`), and one of a
    PaymentIntent that has not succeeded (400): nothing is refunded by a refused request.
    `reason` is taken (one of REFUND_REASONS) and kept on the object."""
    from localstripe.resources import Charge, Refund

    init = Refund.__init__

    def init_with_rules(self, charge=None, payment_intent=None, amount=None,
                        reason=None, metadata=None, **kwargs):
        if reason is not None and reason not in REFUND_REASONS:
            raise UserError(400, "Invalid reason: must be one of "
                            + ", ".join(REFUND_REASONS), {"param": "reason"})
        paid = None
        if isinstance(payment_intent, str):
            intent = PaymentIntent._api_retrieve(payment_intent)
            if intent.status != "succeeded" or intent.latest_charge is None:
                raise UserError(400, f"This PaymentIntent ({payment_intent}) does not "
                                "have a successful charge to refund.",
                                {"param": "payment_intent"})
            paid = intent.latest_charge
        elif isinstance(charge, str):
            paid = Charge._api_retrieve(charge)
        if paid is not None:
            # A refund that failed or was cancelled returned nothing: it takes nothing.
            refunded = sum(
                r.amount for r in paid.refunds._list
                if getattr(r, "status", "succeeded") in ("succeeded", "pending")
            )
            remaining = paid.amount - refunded
            if remaining <= 0:
                raise UserError(400, f"Charge {paid.id} has already been refunded.",
                                {"code": "charge_already_refunded"})
            wanted = remaining if amount is None else resources.try_convert_to_int(amount)
            if isinstance(wanted, int) and wanted > remaining:
                raise UserError(400, f"Refund amount ({wanted}) is greater than "
                                f"unrefunded amount on charge ({remaining})",
                                {"param": "amount"})
            amount = wanted
        init(self, charge=charge, payment_intent=payment_intent, amount=amount,
             metadata=metadata, **kwargs)
        self.reason = reason
        self.failure_reason = None
        if PENDING_REFUND.pop(CURRENT_KEY.get(None), None) is not None:
            # The bank has it: `pending` until `POST /_layer/refunds/<id>/settle`.
            self.status = "pending"

    Refund.__init__ = init_with_rules

    # localstripe fails (a 500 that is no JSON) listing the refunds of a PaymentIntent
    # that has no charge yet; Stripe lists none.
    list_all = Refund._api_list_all.__func__

    def list_of_payment(cls, url, charge=None, payment_intent=None, created=None,
                        **kwargs):
        bounds = created_bounds(created)
        if isinstance(payment_intent, str):
            intent = PaymentIntent._api_retrieve(payment_intent)
            if getattr(intent, "latest_charge", None) is None:
                page = list_all(cls, url, **kwargs)
                page._list = []
                return page
        page = list_all(cls, url, charge=charge, payment_intent=payment_intent, **kwargs)
        # `created` as Stripe reads it, before the page is cut.
        page._list = [
            r for r in page._list if all(holds(r.created, bound) for holds, bound in bounds)
        ]
        return page

    Refund._api_list_all = classmethod(list_of_payment)


def unknown_parameter(sent: str) -> web.Response:
    """Stripe's 400 for a parameter it does not declare."""
    return stripe_error(400, {
        "type": "invalid_request_error",
        "code": "parameter_unknown",
        "param": sent,
        "message": f"Received unknown parameter: {sent}",
    })


def undeclared(params: dict, version: str) -> web.Response | None:
    """Stripe's 400 `parameter_unknown` for a create parameter its version does not
    declare, or its 400 for a card-on-file usage it does not know; None if every one is
    declared."""
    for sent in params:
        first = sent.split("[", 1)[0]
        option = sent[len(CARD):].split("]", 1)[0] if sent.startswith(CARD) else None
        since = CARD_OPTIONS.get(option, None) if option is not None else ""
        if first not in CREATE_PARAMETERS or since is None or version[:10] < since:
            return unknown_parameter(sent)
        if option == "stored_credential_usage" and any(
            v not in STORED_CREDENTIAL_USAGES for v in params[sent]
        ):
            return stripe_error(400, {
                "type": "invalid_request_error",
                "param": sent,
                "message": f"Invalid {sent}: must be one of unscheduled, recurring, or "
                           "installment",
            })
    return None


# What Stripe declares for the other requests charge-once makes, by their first name:
# the lists (docs.stripe.com/api/payment_intents/list, /api/events/list), the retrieve
# and the cancel. Stripe refuses another name as it refuses one on a create.
DECLARED = {
    ("GET", "list"): {"customer", "created", "limit", "starting_after", "ending_before",
                      "expand"},
    ("GET", "retrieve"): {"client_secret", "expand"},
    ("POST", "cancel"): {"cancellation_reason", "expand"},
    ("GET", "events"): {"type", "types", "created", "limit", "starting_after",
                        "ending_before", "delivery_success", "expand"},
}


def request_kind(method: str, path: str) -> tuple[str, str] | None:
    parts = path.strip("/").split("/")
    if parts == ["v1", "events"]:
        return (method, "events")
    if parts[:2] != ["v1", "payment_intents"]:
        return None
    if len(parts) == 2 and method == "GET":
        return (method, "list")
    if len(parts) == 3:
        return (method, "retrieve")
    if len(parts) == 4 and parts[3] == "cancel":
        return (method, "cancel")
    return None


def undeclared_elsewhere(request: web.Request, params: dict) -> web.Response | None:
    """Stripe's 400 `parameter_unknown` for a list, retrieve or cancel naming what it
    does not declare, or None."""
    declared = DECLARED.get(request_kind(request.method, request.path) or ("", ""))
    if declared is None:
        return None
    for sent in params:
        if sent.split("[", 1)[0] not in declared:
            return unknown_parameter(sent)
    return None


def names(params: dict, name: str) -> bool:
    """Whether `name` or any `name[...]` was sent."""
    return any(sent == name or sent.startswith(name + "[") for sent in params)


def refusal(request: web.Request, params: dict) -> web.Response | None:
    """Stripe's 400 for a PaymentIntent request it refuses before any endpoint runs,
    or None."""
    if not request.path.startswith("/v1/payment_intents"):
        return None
    version = request.headers.get("Stripe-Version", ACCOUNT_VERSION)
    if version[:10] >= ENDIVE and names(params, "payment_method_types"):
        return stripe_error(400, {
            "type": "invalid_request_error",
            "code": "payment_method_types_no_longer_supported",
            "param": "payment_method_types",
            "message": (
                f"`payment_method_types` is not supported on API version {version}: "
                "use dynamic payment methods (`automatic_payment_methods`)."
            ),
        })
    if request.method == "POST" and request.path == "/v1/payment_intents":
        unknown = undeclared(params, version)
        if unknown is not None:
            return unknown
    unknown = undeclared_elsewhere(request, params)
    if unknown is not None:
        return unknown
    confirm = [v.lower() for v in params.get("confirm", [])]
    if request.path != "/v1/payment_intents" or confirm != ["true"]:
        return None
    if (
        names(params, "payment_method_types")
        or params.get("automatic_payment_methods[allow_redirects]") == ["never"]
        or any(params.get("return_url", []))
    ):
        return None
    return stripe_error(400, {
        "type": "invalid_request_error",
        "message": RETURN_URL_REQUIRED,
    })


def server_error() -> web.Response:
    """Stripe's answer when it cannot say what became of a request."""
    return stripe_error(500, {
        "type": "api_error",
        "message": "An unknown error occurred",
    })


# payment_intent id -> time.monotonic() from which lists and GETs show it.
HIDDEN: dict[str, float] = {}


def visible(intent) -> bool:
    return HIDDEN.get(intent.id, 0.0) <= time.monotonic()


def hide_until_later(response: web.StreamResponse, after: float) -> None:
    """Hides the PaymentIntent an answer names (made, or left by a decline) for
    `after` seconds: it rolls forward later."""
    try:
        body = json.loads(getattr(response, "body", b""))
    except (ValueError, TypeError):
        return
    made = body.get("id") if response.status < 300 else (
        (body.get("error") or {}).get("payment_intent") or {}).get("id")
    if isinstance(made, str):
        HIDDEN[made] = time.monotonic() + after


def hidden_intent_named(path: str) -> str | None:
    """The hidden PaymentIntent a `/v1/payment_intents/<id>…` path names, if any."""
    if not path.startswith("/v1/payment_intents/"):
        return None
    named = path.removeprefix("/v1/payment_intents/").split("/")[0]
    if HIDDEN.get(named, 0.0) > time.monotonic():
        return named
    return None


def no_such_payment_intent(id: str) -> web.Response:
    return stripe_error(404, {
        "type": "invalid_request_error",
        "code": "resource_missing",
        "param": "intent",
        "message": f"No such payment_intent: '{id}'",
    })


@dataclass
class Destination:
    """One EventBridge event destination and what it did."""
    client: object
    bus: str
    source: str
    order_id_prefix: str | None
    customer: str | None
    published: int = 0
    failed: int = 0
    pending: int = 0
    types: dict = None


class EventBridge:
    """Stripe's event destinations of type `amazon_eventbridge`: every PaymentIntent
    event, put on each armed partner event bus."""

    def __init__(self) -> None:
        self.destinations: dict[str, Destination] = {}
        self.next_id = 0

    async def control(self, request: web.Request) -> web.Response:
        path = request.path.removeprefix("/_layer/eventbridge").strip("/")
        if not path and request.method == "POST":
            return await self.add(request)
        destination = self.destinations.get(path)
        if destination is None:
            return web.Response(status=404, text=f"no destination {path}")
        if request.method == "DELETE":
            del self.destinations[path]
            return web.Response(status=204)
        return web.json_response({
            "published": destination.published,
            "failed": destination.failed,
            "pending": destination.pending,
            "types": destination.types,
        })

    async def add(self, request: web.Request) -> web.Response:
        try:
            asked = await request.json()
            endpoint, region = asked["endpoint"], asked["region"]
            access_key, secret_key = asked["access_key"], asked["secret_key"]
            bus, source = asked["bus"], asked["source"]
            prefix = asked.get("order_id_prefix")
            customer = asked.get("customer")
        except (ValueError, KeyError, TypeError):
            return web.Response(
                status=400,
                text="want {endpoint, region, access_key, secret_key, bus, source}",
            )
        if not str(source).startswith("aws.partner/stripe.com"):
            return web.Response(status=400, text=f"not a Stripe event source: {source}")
        if len(self.destinations) >= MAX_DESTINATIONS:
            return web.Response(status=400, text=f"at most {MAX_DESTINATIONS} destinations")
        # Imported once a test arms a destination: most runs never need it.
        import boto3
        from botocore.config import Config

        client = boto3.client(
            "events", endpoint_url=endpoint, region_name=region,
            aws_access_key_id=access_key, aws_secret_access_key=secret_key,
            config=Config(retries={"max_attempts": 1}, connect_timeout=5, read_timeout=10),
        )
        self.next_id += 1
        name = str(self.next_id)
        self.destinations[name] = Destination(
            client=client, bus=bus, source=source, order_id_prefix=prefix,
            customer=customer, types={})
        return web.json_response({"destination": name})

    def publish(self, event) -> None:
        """Schedules `event` (a localstripe `Event`) for every destination it is for."""
        if not event.type.startswith("payment_intent.") or not self.destinations:
            return
        intent = event.data["object"]
        order_id = str((intent.get("metadata") or {}).get("order_id", ""))
        detail = json.dumps(event._export(), sort_keys=True, default=str)
        for destination in list(self.destinations.values()):
            prefix = destination.order_id_prefix
            if prefix is not None and not order_id.startswith(prefix):
                continue
            if destination.customer is not None and intent.get("customer") != destination.customer:
                continue
            destination.pending += 1
            asyncio.ensure_future(self.put(destination, event.type, intent["id"], detail))

    async def put(self, destination: Destination, kind: str, intent: str, detail: str) -> None:
        delay = max(EVENT_DELAY_S, HIDDEN.get(intent, 0.0) - time.monotonic())
        await asyncio.sleep(delay)
        entry = {
            "Source": destination.source,
            "DetailType": kind,
            "Detail": detail,
            "EventBusName": destination.bus,
            "Resources": [],
        }
        loop = asyncio.get_running_loop()
        try:
            for attempt in range(PUT_TRIES):
                try:
                    answer = await loop.run_in_executor(
                        None, lambda: destination.client.put_events(Entries=[entry]))
                    if answer.get("FailedEntryCount", 0) == 0:
                        destination.published += 1
                        destination.types[kind] = destination.types.get(kind, 0) + 1
                        return
                    failure = answer.get("Entries")
                except Exception as e:  # the put failed: counted, told, tried again
                    failure = repr(e)
                print(f"eventbridge: {kind} {intent} (try {attempt + 1}): {failure}",
                      file=sys.stderr, flush=True)
                await asyncio.sleep(0.2)
            destination.failed += 1
        finally:
            destination.pending -= 1


EVENTS = EventBridge()


def publish_events() -> None:
    """Every Event localstripe schedules for its webhooks also goes to the armed
    destinations; and the PaymentIntent events it never makes are made here."""
    schedule = resources.schedule_webhook

    def schedule_and_publish(event):
        schedule(event)
        EVENTS.publish(event)

    resources.schedule_webhook = schedule_and_publish

    # localstripe's routes hold the cancel and `_authenticate` methods themselves (its
    # `extra_apis`), so their events are made from their answers (`events_of_answer`).
    create = PaymentIntent._api_create.__func__

    def create_with_event(cls, confirm=None, off_session=None, **data):
        intent = create(cls, confirm=confirm, off_session=off_session, **data)
        if resources.try_convert_to_bool(off_session) and intent.status == "requires_action":
            # Stripe answers this confirm with a 402 `authentication_required` and
            # sends `payment_intent.payment_failed`; localstripe sends nothing.
            event = resources.Event("payment_intent.payment_failed", intent)
            event.data["object"]["last_payment_error"] = {
                "type": "card_error",
                "code": "authentication_required",
                "decline_code": "authentication_required",
                "message": "Your card was declined. This transaction requires authentication.",
            }
            resources.schedule_webhook(event)
        return intent

    PaymentIntent._api_create = classmethod(create_with_event)


async def events_of_answer(request: web.Request, response: web.StreamResponse) -> None:
    """The events Stripe sends for a cancel (`payment_intent.canceled`) and for a
    failed authentication (`payment_intent.payment_failed`), which localstripe never
    makes: made once the change is answered."""
    parts = request.path.strip("/").split("/")
    if (
        request.method != "POST" or response.status != 200 or len(parts) != 4
        or parts[:2] != ["v1", "payment_intents"]
    ):
        return
    intent = store.get(f"payment_intent:{parts[2]}")
    if intent is None:
        return
    if parts[3] == "cancel":
        resources.schedule_webhook(resources.Event("payment_intent.canceled", intent))
    elif parts[3] == "_authenticate":
        params = parameters(request.query_string, await request.read())
        success = resources.try_convert_to_bool((params.get("success") or ["false"])[-1])
        if success is not True:
            resources.schedule_webhook(resources.Event("payment_intent.payment_failed", intent))


async def answer(handler, request: web.Request) -> web.StreamResponse:
    """localstripe's answer with what Stripe adds: `resource_missing`, the
    PaymentIntent a decline left behind, and the events localstripe does not make."""
    response = decline_names_its_payment_intent(await missing_object_named(handler, request))
    await events_of_answer(request, response)
    return response


def decline_names_its_payment_intent(response: web.StreamResponse) -> web.StreamResponse:
    """A 402 card error names the PaymentIntent it left `requires_payment_method`
    (Stripe's `error.payment_intent`, the object); localstripe names only the charge."""
    body = getattr(response, "body", None)
    if response.status != 402 or not isinstance(body, bytes):
        return response
    try:
        error = json.loads(body)["error"]
    except (ValueError, KeyError, TypeError):
        return response
    if not isinstance(error, dict) or "payment_intent" in error:
        return response
    charge = resources.store.get(f"charge:{error.get('charge')}")
    intent_id = getattr(charge, "payment_intent", None)
    if intent_id is None:
        return response
    intent = resources.store.get(f"payment_intent:{intent_id}")
    if intent is None:
        return response
    return stripe_error(402, {**error, "payment_intent": intent._export()})


async def seed(request: web.Request) -> web.Response:
    """`count` PaymentIntents of `customer` created at `created` (seconds), made in
    localstripe's store directly: earlier orders' payments, cheaply."""
    try:
        asked = await request.json()
        customer, count, created = asked["customer"], int(asked["count"]), int(asked["created"])
        amount = int(asked.get("amount", 1000))
    except (ValueError, KeyError, TypeError):
        return web.Response(status=400, text="want {customer, count, created}")
    if not 0 < count <= MAX_SEEDED:
        return web.Response(status=400, text=f"count: 1 to {MAX_SEEDED}")
    try:
        for n in range(count):
            intent = PaymentIntent(
                amount=amount, currency="eur", customer=customer,
                metadata={"order_id": f"seed-{customer}-{n}"},
            )
            intent.created = created
    except UserError as e:
        return e.to_response()
    return web.json_response({"count": count})


def parameters(query: str, body: bytes) -> dict:
    """A request's parameters, in the order each name's values came."""
    params: dict = {}
    for name, value in parse_qsl(query, keep_blank_values=True):
        params.setdefault(name, []).append(value)
    form = body.decode("utf-8", "replace")
    for name, value in parse_qsl(form, keep_blank_values=True):
        params.setdefault(name, []).append(value)
    return params


class Layer:
    def __init__(self) -> None:
        self.stored: dict[tuple[str, str], Stored] = {}
        self.waiting: dict[str, asyncio.Event] = {}
        self.released: dict[str, asyncio.Event] = {}
        # The `Stripe-Version` header of every keyed POST, per idempotency key
        # (empty string: none sent), so a test can see what reached the server.
        self.versions: dict[str, list[str]] = {}
        # Every request but the layer's own, oldest first (the oldest are dropped past
        # REQUEST_LOG_SIZE).
        self.requests: collections.deque = collections.deque(maxlen=REQUEST_LOG_SIZE)
        # idempotency key -> (fault, seconds the payment stays hidden)
        self.faults: dict[str, tuple[str, float]] = {}

    def hold(self, name: str) -> tuple[asyncio.Event, asyncio.Event]:
        return (
            self.waiting.setdefault(name, asyncio.Event()),
            self.released.setdefault(name, asyncio.Event()),
        )

    async def holds(self, request: web.Request, name: str) -> web.StreamResponse:
        waiting, released = self.hold(name)
        if request.method == "DELETE":
            released.set()
            return web.Response(status=204)
        try:
            await asyncio.wait_for(waiting.wait(), HOLD_SECONDS)
        except asyncio.TimeoutError:
            return web.Response(status=404, text=f"no request holds {name}")
        return web.Response(status=204)

    async def control(self, request: web.Request) -> web.StreamResponse:
        """The `/_layer/…` endpoints a test drives the layer with."""
        path = request.path
        if path.startswith("/_layer/holds/"):
            return await self.holds(request, path.removeprefix("/_layer/holds/"))
        if path.startswith("/_layer/versions/"):
            name = path.removeprefix("/_layer/versions/")
            return web.json_response(self.versions.get(name, []))
        if path == "/_layer/requests" and request.method == "GET":
            wanted = request.query.get("path")
            return web.json_response([
                seen for seen in self.requests if wanted is None or seen["path"] == wanted
            ])
        if path == "/_layer/seed" and request.method == "POST":
            return await seed(request)
        if path == "/_layer/faults" and request.method == "POST":
            return await self.add_fault(request)
        if path.startswith("/_layer/refunds/") and request.method == "POST":
            return await refund_control(request)
        if path == "/_layer/eventbridge" or path.startswith("/_layer/eventbridge/"):
            return await EVENTS.control(request)
        return web.Response(status=404, text=f"no layer endpoint {request.method} {path}")

    async def add_fault(self, request: web.Request) -> web.Response:
        try:
            asked = await request.json()
            key, fault = asked["key"], asked["fault"]
            after = float(asked.get("after_s", 0))
        except (ValueError, KeyError, TypeError):
            return web.Response(status=400, text="want {key, fault, after_s}")
        if not isinstance(key, str) or fault not in FAULTS or not 0 <= after <= MAX_HIDDEN_S:
            return web.Response(status=400, text=f"no such fault: {asked}")
        self.faults[key] = (fault, after)
        return web.Response(status=204)

    def log(self, request: web.Request) -> None:
        self.requests.append({
            "method": request.method,
            "path": request.path,
            "query": request.query_string,
            "stripe_version": request.headers.get("Stripe-Version", ""),
            "idempotency_key": request.headers.get("Idempotency-Key"),
        })

    @web.middleware
    async def middleware(self, request: web.Request, handler) -> web.StreamResponse:
        if request.path.startswith("/_layer/"):
            return await self.control(request)
        self.log(request)
        hidden = hidden_intent_named(request.path)
        if hidden is not None:
            return no_such_payment_intent(hidden)
        if request.method != "POST":
            query = parameters(request.query_string, b"")
            return undeclared_elsewhere(request, query) or await answer(handler, request)
        key = request.headers.get("Idempotency-Key")
        if key is not None:
            self.versions.setdefault(key, []).append(request.headers.get("Stripe-Version", ""))
        api_key = get_api_key(request)
        if api_key is None:  # localstripe refuses it with a 401, before any rule
            return await handler(request)

        # The key is taken once the request has arrived whole, as at Stripe: two
        # requests sent at once are then an original and its replay, as in
        # stripe-stateful-mock, and a 409 needs a request held on purpose.
        body = await request.read()
        params = parameters(request.query_string, body)
        if key is None:
            return refusal(request, params) or await answer(handler, request)
        scope = (api_key, key)
        stored = self.stored.get(scope)
        if stored is not None:
            return self.replay(stored, key, request.path, params)
        # A request that fails validation reached no endpoint: nothing is kept under
        # its key, so the same request is refused again by the rule (not replayed),
        # and a corrected one under the same key is answered as new.
        refused = refusal(request, params)
        if refused is not None:
            return refused

        stored = self.stored[scope] = Stored(path=request.path, params=params)
        CURRENT_KEY.set(key)
        fault = None
        if request.path in ("/v1/payment_intents", "/v1/refunds"):
            fault = self.faults.pop(key, None)
        try:
            name = request.headers.get("Layer-Hold")
            if name is not None:
                waiting, released = self.hold(name)
                waiting.set()
                try:
                    await asyncio.wait_for(released.wait(), HOLD_SECONDS)
                except asyncio.TimeoutError:
                    pass
            if fault is not None and fault[0] == "server_error":
                response = server_error()
            else:
                response = await answer(handler, request)
                if fault is not None:
                    hide_until_later(response, fault[1])
                    response = server_error()
        except BaseException:
            del self.stored[scope]
            raise
        kept = getattr(response, "body", None)  # a streamed answer has none to keep
        if response.status in NOT_STORED or not isinstance(kept, bytes):
            del self.stored[scope]
        else:
            stored.status = response.status
            stored.body = kept
            stored.content_type = response.content_type
        return response

    @staticmethod
    def replay(stored: Stored, key: str, path: str, params: dict) -> web.Response:
        if stored.path != path or stored.params != params:
            used = (
                "with the same parameters they were first used with"
                if stored.path == path
                else "for the same endpoint they were first used for "
                f"('{stored.path}' vs '{path}')"
            )
            return stripe_error(400, {
                "type": "idempotency_error",
                "message": (
                    f"Keys for idempotent requests can only be used {used}. Try using "
                    f"a key other than '{key}' if you meant to execute a different "
                    "request."
                ),
            })
        if stored.status is None:
            return stripe_error(409, {
                "type": "invalid_request_error",
                "code": "idempotency_key_in_use",
                "message": (
                    "There is currently another in-progress request using this "
                    "Idempotent Key (that probably means you submitted twice, and the "
                    f"other request is still going through): {key}. Please try again "
                    "later."
                ),
            })
        return web.Response(
            status=stored.status,
            body=stored.body,
            content_type=stored.content_type,
            headers={"Idempotent-Replayed": "true"},
        )


RATE_LIMITED = {
    "type": "invalid_request_error",
    "code": "rate_limit",
    "message": (
        "Request rate limit exceeded. Learn more about rate limits here "
        "https://stripe.com/docs/rate-limits."
    ),
}
LOCK_TIMEOUT = {
    "type": "invalid_request_error",
    "code": "lock_timeout",
    "message": (
        "This object cannot be accessed right now because another API request or "
        "Stripe process is currently accessing it. If you see this error "
        "intermittently, retry the request. If you see this error frequently and are "
        "making multiple concurrent requests to a single object, make your requests "
        "serially or at a lower rate. See https://stripe.com/docs/rate-limits for "
        "more details."
    ),
}


def endpoint(method: str, path: str) -> str:
    """The method and the route, ids replaced: Stripe counts every named operation as
    one endpoint, whatever object it names."""
    parts = path.strip("/").split("/")
    if len(parts) >= 3 and parts[0] == "v1":
        parts[2] = ":id"
    return f"{method} /" + "/".join(parts)


class Limits:
    """The per-endpoint rate limit and the per-customer lock, with their counters."""

    def __init__(self) -> None:
        self.configure({})

    def configure(self, settings: dict) -> None:
        rate = settings.get("per_endpoint_per_s")
        self.rate = float(rate) if rate else None
        self.lock_s = float(settings.get("lock_ms") or 0) / 1000.0
        self.lock_wait_s = float(settings.get("lock_wait_ms") or 0) / 1000.0
        # endpoint -> (tokens, when they were counted)
        self.buckets: dict[str, tuple[float, float]] = {}
        self.customers: dict[str, asyncio.Lock] = {}
        self.accepted: dict[str, int] = {}
        self.refused: dict[str, int] = {}
        self.locks = 0

    def counters(self) -> dict:
        return {"accepted": self.accepted, "refused": self.refused, "locks": self.locks}

    def take_token(self, name: str) -> bool:
        if self.rate is None:
            return True
        now = time.monotonic()
        tokens, then = self.buckets.get(name, (self.rate, now))
        tokens = min(self.rate, tokens + (now - then) * self.rate)
        if tokens < 1.0:
            self.buckets[name] = (tokens, now)
            return False
        self.buckets[name] = (tokens - 1.0, now)
        return True

    @staticmethod
    def customer_of(request: web.Request, form: dict) -> str | None:
        """The customer a request touches: named by the create or the list, or the
        owner of the PaymentIntent its path names."""
        named = form.get("customer") or request.query.get("customer")
        if named:
            return named
        parts = request.path.strip("/").split("/")
        if len(parts) >= 3 and parts[:2] == ["v1", "payment_intents"]:
            intent = store.get(f"payment_intent:{parts[2]}")
            return getattr(intent, "customer", None)
        return None

    @web.middleware
    async def middleware(self, request: web.Request, handler) -> web.StreamResponse:
        if request.path == "/_layer/limits":
            if request.method == "POST":
                self.configure(await request.json())
                return web.Response(status=204)
            return web.json_response(self.counters())
        if not request.path.startswith("/v1/"):
            return await handler(request)
        name = endpoint(request.method, request.path)
        if not self.take_token(name):
            self.refused[name] = self.refused.get(name, 0) + 1
            response = stripe_error(429, RATE_LIMITED)
            response.headers["Stripe-Rate-Limited-Reason"] = "endpoint-rate"
            return response
        self.accepted[name] = self.accepted.get(name, 0) + 1
        if self.lock_s <= 0:
            return await handler(request)
        form = {}
        if request.method == "POST":
            form = dict(parse_qsl((await request.read()).decode("utf-8", "replace")))
        customer = self.customer_of(request, form)
        if customer is None:
            return await handler(request)
        lock = self.customers.setdefault(customer, asyncio.Lock())
        try:
            await asyncio.wait_for(lock.acquire(), self.lock_wait_s)
        except asyncio.TimeoutError:
            self.locks += 1
            return stripe_error(429, LOCK_TIMEOUT)
        try:
            response = await handler(request)
            if name == "POST /v1/payment_intents":
                await asyncio.sleep(self.lock_s)
            return response
        finally:
            lock.release()


# The permission a restricted key needs per request (Stripe's restricted keys,
# docs.stripe.com/keys#limit-access): by the path's resource, `_read` for a GET and
# `_write` for anything else; a `_write` permission also reads.
RESOURCES = {
    "payment_intents": "payment_intent",
    "refunds": "refund",
    "events": "event",
    "charges": "charge",
    "customers": "customer",
    "payment_methods": "payment_method",
}


def permission_needed(method: str, path: str) -> str:
    parts = path.strip("/").split("/")
    resource = RESOURCES.get(parts[1] if len(parts) > 1 else "", parts[-1])
    return f"rak_{resource}_{'read' if method == 'GET' else 'write'}"


class RestrictedKeys:
    """Stripe's restricted keys (`rk_…`), which localstripe does not know (it takes
    `sk_` keys only). `POST /_layer/restricted_keys` with JSON `{"key": "rk_test_…",
    "permissions": ["rak_payment_intent_write", …]}` makes a key; a request with it is
    answered as Stripe answers a restricted key: an unknown one is a 401, one without
    the permission the request needs is Stripe's 403, whose message names the missing
    permission (and the key, masked but for its last four characters, as Stripe's
    does); a permitted one reaches localstripe under a secret key of the same account.
    Before the limiters and the idempotency layer: Stripe authenticates first."""

    def __init__(self):
        self.keys: dict[str, set[str]] = {}

    @web.middleware
    async def middleware(self, request: web.Request, handler) -> web.StreamResponse:
        if request.path == "/_layer/restricted_keys" and request.method == "POST":
            sent = await request.json()
            self.keys[sent["key"]] = set(sent["permissions"])
            return web.Response(status=204)
        header = request.headers.get("Authorization", "")
        key = header[len("Bearer "):] if header.startswith("Bearer ") else ""
        if not key.startswith("rk_") or not request.path.startswith("/v1/"):
            return await handler(request)
        permissions = self.keys.get(key)
        if permissions is None:
            return stripe_error(401, {
                "type": "invalid_request_error",
                "message": f"Invalid API Key provided: {key[:8]}{'*' * 20}{key[-4:]}",
            })
        needed = permission_needed(request.method, request.path)
        granted = needed in permissions or (
            needed.endswith("_read") and needed[:-5] + "_write" in permissions
        )
        if not granted:
            return stripe_error(403, {
                "type": "invalid_request_error",
                "message": (
                    f"The provided key '{key[:8]}{'*' * 20}{key[-4:]}' does not have the "
                    "required permissions for this endpoint on account "
                    f"'acct_localstripe'. Having the '{needed}' permission would allow "
                    "this request to continue."
                ),
            })
        headers = request.headers.copy()
        headers["Authorization"] = "Bearer sk_" + key[len("rk_"):]
        return await handler(request.clone(headers=headers))


# Stripe's test PaymentMethod ids that `events/` names, as the cards localstripe knows
# that behave the same off-session (docs.stripe.com/testing): 0341 declines on charge,
# 3184 always asks for authentication.
TEST_PAYMENT_METHODS = {
    "pm_card_chargeDeclined": "4000000000000341",
    "pm_card_authenticationRequired": "4000002760003184",
}


def add_local_fixtures() -> None:
    """For `make watch` (`--local`): Stripe's test PaymentMethod ids of `events/`
    beside the ones localstripe knows, and `POST /v1/customers` with the `id` the
    events name (`cus_123`, ...), as stripe-stateful-mock takes it."""
    from localstripe.resources import Customer, PaymentMethod, store

    canonical = PaymentMethod._try_get_canonical_test_article.__func__

    def with_test_ids(cls, id):
        number = TEST_PAYMENT_METHODS.get(id)
        if number is None:
            return canonical(cls, id)
        card = dict(number=number, exp_month="12", exp_year="2034", cvc="123")
        return PaymentMethod(type="card", card=card)

    PaymentMethod._try_get_canonical_test_article = classmethod(with_test_ids)

    create = Customer._api_create.__func__

    def create_with_id(cls, id=None, **data):
        if id is None:
            return create(cls, **data)
        if store.get(f"customer:{id}") is not None:
            raise UserError(400, f"Customer already exists: {id}")
        customer = create(cls, **data)
        del store[f"customer:{customer.id}"]
        customer.id = id
        store[f"customer:{id}"] = customer
        return customer

    Customer._api_create = classmethod(create_with_id)


async def serve(port: int, local: bool) -> None:
    keep_store_in_memory()
    add_list_filters()
    add_description()
    add_refund_rules()
    publish_events()
    if local:
        add_local_fixtures()
    app.middlewares.insert(0, Layer().middleware)
    # Outermost: Stripe's limiters answer before the idempotency layer stores anything,
    # and authenticates before its limiters.
    app.middlewares.insert(0, Limits().middleware)
    app.middlewares.insert(0, RestrictedKeys().middleware)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", port))
    await web.SockSite(runner, sock).start()
    print(f"PORT={sock.getsockname()[1]}", flush=True)
    await asyncio.Event().wait()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--detached", action="store_true")
    parser.add_argument("--local", action="store_true")
    args = parser.parse_args()

    def exit_when_parent_ends() -> None:
        sys.stdin.read()
        os._exit(0)

    if not args.detached:
        threading.Thread(target=exit_when_parent_ends, daemon=True).start()
    asyncio.run(serve(args.port, args.local))


if __name__ == "__main__":
    main()
