"""Creates what `make watch` needs on the local servers; safe to run again.

usage: local_setup.py MOTO_URL TABLE STRIPE_URL
- the idempotency table (pk S, on demand, TTL on `expira`) in moto;
- the dead-letter queue `charge-once-local-dlq` in moto's SQS (DEAD_LETTER_QUEUE_URL);
- the customers used by events/ (cus_123, cus_456, cus_789, cus_fanout, cus_declined,
  cus_timeout_after_charge) in localstripe; their orders name Stripe's test
  PaymentMethod ids, which decide what a payment does.
"""

import sys
import urllib.error
import urllib.parse
import urllib.request

import boto3

moto_url, table, stripe_url = sys.argv[1:4]

dynamodb = boto3.client(
    "dynamodb",
    endpoint_url=moto_url,
    region_name="us-east-1",
    aws_access_key_id="test",
    aws_secret_access_key="test",
)
if table not in dynamodb.list_tables()["TableNames"]:
    dynamodb.create_table(
        TableName=table,
        AttributeDefinitions=[
            {"AttributeName": "pk", "AttributeType": "S"},
            {"AttributeName": "estado", "AttributeType": "S"},
            {"AttributeName": "espera_hasta", "AttributeType": "N"},
        ],
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        # The sparse index of the records that await their customer (template.yaml).
        GlobalSecondaryIndexes=[
            {
                "IndexName": "espera",
                "KeySchema": [
                    {"AttributeName": "estado", "KeyType": "HASH"},
                    {"AttributeName": "espera_hasta", "KeyType": "RANGE"},
                ],
                "Projection": {"ProjectionType": "ALL"},
            }
        ],
        BillingMode="PAY_PER_REQUEST",
    )
    dynamodb.update_time_to_live(
        TableName=table,
        TimeToLiveSpecification={"AttributeName": "expira", "Enabled": True},
    )

boto3.client(
    "sqs",
    endpoint_url=moto_url,
    region_name="us-east-1",
    aws_access_key_id="test",
    aws_secret_access_key="test",
).create_queue(QueueName="charge-once-local-dlq")

# The customers events/ names; each pays with the Stripe test PaymentMethod id its
# message carries (`pm_card_visa`, `pm_card_chargeDeclined`,
# `pm_card_authenticationRequired`), which localstripe started with `--local` knows.
customers = [
    "cus_123",
    "cus_456",
    "cus_789",
    "cus_fanout",
    "cus_declined",
    "cus_timeout_after_charge",
]
for customer in customers:
    data = urllib.parse.urlencode({"id": customer}).encode()
    request = urllib.request.Request(
        f"{stripe_url}/v1/customers",
        data=data,
        headers={"Authorization": "Bearer sk_test_local"},
    )
    try:
        urllib.request.urlopen(request, timeout=5).read()
    except urllib.error.HTTPError as e:
        if e.code != 400:  # 400: the customer exists already
            raise
