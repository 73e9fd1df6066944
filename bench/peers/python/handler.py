"""The Powertools for AWS Lambda (Python) peer of `make bench`.

The same work as charge-once, written the way the Powertools docs show it: SQS
partial batch responses (BatchProcessor, records one after another), an idempotent
function keyed on the order id with payload validation on the charged fields, the
Lambda context registered so an in-progress record expires with the invocation, and
the same HTTP charge as charge-once (the same form body, bearer key, Idempotency-Key
header) to the payment URL it is given: the bench's payment stub, or localstripe in
the drain. A refused charge (a 429 too) fails its record, which SQS delivers again, as
Powertools leaves it. Configuration comes from the environment, like charge-once's.
"""

import json
import os
import re

import urllib3
from aws_lambda_powertools.utilities.batch import (
    BatchProcessor,
    EventType,
    process_partial_response,
)
from aws_lambda_powertools.utilities.idempotency import (
    DynamoDBPersistenceLayer,
    IdempotencyConfig,
    idempotent_function,
)

PAYMENT_URL = os.environ["PAYMENT_API_URL"].rstrip("/") + "/v1/payment_intents"
PAYMENT_KEY = os.environ["PAYMENT_API_KEY"]
PAYMENT_TIMEOUT = float(os.environ.get("PAYMENT_TIMEOUT_SECONDS", "1"))

persistence = DynamoDBPersistenceLayer(
    table_name=os.environ["IDEMPOTENCY_TABLE"], key_attr="pk"
)
config = IdempotencyConfig(
    event_key_jmespath="id",
    payload_validation_jmespath="[amount, currency, customer, payment_method]",
    expires_after_seconds=24 * 3600,
)
processor = BatchProcessor(event_type=EventType.SQS)
http = urllib3.PoolManager(maxsize=10, retries=False)

ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


def parse_order(body):
    """DESIGN §2's rules, as charge-once applies them (raw order or SNS envelope)."""
    value = json.loads(body)
    if not isinstance(value, dict):
        raise ValueError("body is not a JSON object")
    if value.get("Type") == "Notification":
        message = value.get("Message")
        if not isinstance(message, str):
            raise ValueError("SNS Message is missing or not a string")
        value = json.loads(message)
        if not isinstance(value, dict):
            raise ValueError("SNS Message is not a JSON object")
    order_id, amount = value.get("id"), value.get("amount")
    currency, customer = value.get("currency"), value.get("customer")
    if not isinstance(order_id, str) or not ID.match(order_id):
        raise ValueError("field `id` is invalid")
    if isinstance(amount, bool) or not isinstance(amount, int) or not 1 <= amount <= 99_999_999:
        raise ValueError("field `amount` is invalid")
    if not isinstance(currency, str) or len(currency) != 3 or not currency.isascii() or not currency.isalpha():
        raise ValueError("field `currency` is invalid")
    if not isinstance(customer, str) or not customer.strip() or len(customer.encode()) > 255:
        raise ValueError("field `customer` is invalid")
    payment_method = value.get("payment_method")
    if not isinstance(payment_method, str) or not payment_method:
        raise ValueError("field `payment_method` is invalid")
    return {
        "id": order_id,
        "amount": amount,
        "currency": currency.upper(),
        "customer": customer,
        "payment_method": payment_method,
    }


@idempotent_function(data_keyword_argument="order", config=config, persistence_store=persistence)
def charge(order):
    response = http.request(
        "POST",
        PAYMENT_URL,
        fields={
            "amount": str(order["amount"]),
            "currency": order["currency"].lower(),
            "customer": order["customer"],
            "payment_method": order["payment_method"],
            "confirm": "true",
            "off_session": "true",
            "automatic_payment_methods[enabled]": "true",
            "automatic_payment_methods[allow_redirects]": "never",
            "description": f"order {order['id']}",
            "metadata[order_id]": order["id"],
        },
        encode_multipart=False,
        headers={
            "Authorization": f"Bearer {PAYMENT_KEY}",
            "Idempotency-Key": f"charge-once:{order['id']}",
        },
        timeout=PAYMENT_TIMEOUT,
    )
    if response.status != 200:
        raise RuntimeError(f"payment failed with HTTP {response.status}")
    return {"charge": json.loads(response.data)["id"]}


def record_handler(record):
    return charge(order=parse_order(record.body))


def handler(event, context):
    config.register_lambda_context(context)
    return process_partial_response(
        event=event, record_handler=record_handler, processor=processor, context=context
    )
