// stripe-stateful-mock for the charge-once tests, bound to 127.0.0.1 on a free port, or
// $PORT (its own CLI listens on every interface). Prints `PORT=<n>` and exits when its
// stdin closes (the test process that started it ended), unless DETACHED=1 (for
// `make watch`, started in the background).
const { createExpressApp } = require('stripe-stateful-mock');
const { charges } = require('stripe-stateful-mock/dist/api/charges');

// stripe-stateful-mock 0.0.16 stores `customer: null` on charges made for a customer,
// so `GET /v1/charges?customer=` finds nothing. Stripe sets it; so does this wrapper,
// on successful and declined (402) charges alike, so reconciliation can be tested.
const create = charges.create;
charges.create = (accountId, params) => {
  const setCustomer = (charge) => {
    if (charge && typeof params.customer === 'string') charge.customer = params.customer;
  };
  try {
    const charge = create(accountId, params);
    setCustomer(charge);
    return charge;
  } catch (err) {
    if (err && err.error && err.error.charge) {
      setCustomer(charges.retrieve(accountId, err.error.charge, 'charge'));
    }
    throw err;
  }
};

const server = createExpressApp().listen(Number(process.env.PORT || 0), '127.0.0.1', () => {
  process.stdout.write(`PORT=${server.address().port}\n`);
});
if (process.env.DETACHED !== '1') {
  process.stdin.on('data', () => {});
  process.stdin.on('end', () => process.exit(0));
  process.stdin.resume();
}
