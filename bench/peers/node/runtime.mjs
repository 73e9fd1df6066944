// A minimal AWS Lambda Runtime API loop for the Node peer of `make bench` (what the
// managed nodejs runtime does, without its extras): fetch the next invocation, call
// the handler with a context whose remaining time follows the deadline header, post
// the answer or the error. Usage: AWS_LAMBDA_RUNTIME_API=host:port node runtime.mjs
const base = `http://${process.env.AWS_LAMBDA_RUNTIME_API}/2018-06-01/runtime`;

let handler;
try {
  ({ handler } = await import('./handler.mjs'));
} catch (error) {
  await fetch(`${base}/init/error`, {
    method: 'POST',
    body: JSON.stringify({ errorType: error.name, errorMessage: error.message }),
  });
  throw error;
}

for (;;) {
  const next = await fetch(`${base}/invocation/next`);
  if (next.status !== 200) process.exit(0); // the emulator is gone
  const requestId = next.headers.get('lambda-runtime-aws-request-id');
  const deadline = Number(next.headers.get('lambda-runtime-deadline-ms'));
  const event = await next.json();
  const context = {
    awsRequestId: requestId,
    functionName: process.env.AWS_LAMBDA_FUNCTION_NAME,
    functionVersion: process.env.AWS_LAMBDA_FUNCTION_VERSION,
    memoryLimitInMB: process.env.AWS_LAMBDA_FUNCTION_MEMORY_SIZE,
    invokedFunctionArn: next.headers.get('lambda-runtime-invoked-function-arn'),
    getRemainingTimeInMillis: () => deadline - Date.now(),
  };
  try {
    const result = await handler(event, context);
    await fetch(`${base}/invocation/${requestId}/response`, {
      method: 'POST',
      body: JSON.stringify(result),
    });
  } catch (error) {
    await fetch(`${base}/invocation/${requestId}/error`, {
      method: 'POST',
      body: JSON.stringify({ errorType: error.name, errorMessage: error.message }),
    });
  }
}
