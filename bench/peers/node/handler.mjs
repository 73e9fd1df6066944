// The Powertools for AWS Lambda (TypeScript) peer of `make bench`, as plain ESM.
//
// The same work as charge-once, written the way the Powertools docs show it: SQS
// partial batch responses (BatchProcessor; its default processes the records of a
// batch in parallel), an idempotent function keyed on the order id with payload
// validation on the charged fields, the Lambda context registered so an in-progress
// record expires with the invocation, and the same HTTP charge as charge-once (the same
// form body, bearer key, Idempotency-Key header) to the payment URL it is given: the
// bench's payment stub, or localstripe in the drain. A refused charge (a 429 too) fails
// its record, which SQS delivers again, as Powertools leaves it.
import {
  BatchProcessor,
  EventType,
  processPartialResponse,
} from '@aws-lambda-powertools/batch';
import { IdempotencyConfig, makeIdempotent } from '@aws-lambda-powertools/idempotency';
import { DynamoDBPersistenceLayer } from '@aws-lambda-powertools/idempotency/dynamodb';

const paymentUrl = `${process.env.PAYMENT_API_URL.replace(/\/$/, '')}/v1/payment_intents`;
const paymentKey = process.env.PAYMENT_API_KEY;
const paymentTimeoutMs = Number(process.env.PAYMENT_TIMEOUT_SECONDS ?? '1') * 1000;

const persistenceStore = new DynamoDBPersistenceLayer({
  tableName: process.env.IDEMPOTENCY_TABLE,
  keyAttr: 'pk',
});
const config = new IdempotencyConfig({
  eventKeyJmesPath: 'id',
  payloadValidationJmesPath: '[amount, currency, customer, payment_method]',
  expiresAfterSeconds: 24 * 3600,
});
const processor = new BatchProcessor(EventType.SQS);

const ID = /^[A-Za-z0-9._:-]{1,128}$/;

// DESIGN §2's rules, as charge-once applies them (raw order or SNS envelope).
function parseOrder(body) {
  let value = JSON.parse(body);
  if (value === null || typeof value !== 'object' || Array.isArray(value)) {
    throw new Error('body is not a JSON object');
  }
  if (value.Type === 'Notification') {
    if (typeof value.Message !== 'string') throw new Error('SNS Message is missing or not a string');
    value = JSON.parse(value.Message);
    if (value === null || typeof value !== 'object' || Array.isArray(value)) {
      throw new Error('SNS Message is not a JSON object');
    }
  }
  const { id, amount, currency, customer } = value;
  if (typeof id !== 'string' || !ID.test(id)) throw new Error('field `id` is invalid');
  if (!Number.isInteger(amount) || amount < 1 || amount > 99_999_999) {
    throw new Error('field `amount` is invalid');
  }
  if (typeof currency !== 'string' || !/^[A-Za-z]{3}$/.test(currency)) {
    throw new Error('field `currency` is invalid');
  }
  if (typeof customer !== 'string' || customer.trim() === '' || Buffer.byteLength(customer) > 255) {
    throw new Error('field `customer` is invalid');
  }
  const paymentMethod = value.payment_method;
  if (typeof paymentMethod !== 'string' || paymentMethod === '') {
    throw new Error('field `payment_method` is invalid');
  }
  return { id, amount, currency: currency.toUpperCase(), customer, paymentMethod };
}

const charge = makeIdempotent(
  async (order) => {
    const response = await fetch(paymentUrl, {
      method: 'POST',
      headers: {
        authorization: `Bearer ${paymentKey}`,
        'idempotency-key': `charge-once:${order.id}`,
        'content-type': 'application/x-www-form-urlencoded',
      },
      body: new URLSearchParams({
        amount: String(order.amount),
        currency: order.currency.toLowerCase(),
        customer: order.customer,
        payment_method: order.paymentMethod,
        confirm: 'true',
        off_session: 'true',
        'automatic_payment_methods[enabled]': 'true',
        'automatic_payment_methods[allow_redirects]': 'never',
        description: `order ${order.id}`,
        'metadata[order_id]': order.id,
      }),
      signal: AbortSignal.timeout(paymentTimeoutMs),
    });
    const body = await response.json();
    if (response.status !== 200) throw new Error(`payment failed with HTTP ${response.status}`);
    return { charge: body.id };
  },
  { persistenceStore, config }
);

const recordHandler = async (record) => charge(parseOrder(record.body));

export const handler = async (event, context) => {
  config.registerLambdaContext(context);
  return processPartialResponse(event, recordHandler, processor, { context });
};
