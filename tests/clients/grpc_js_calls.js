'use strict';
// Unary gRPC calls with @grpc/grpc-js, on raw message bytes (no .proto needed).
// Usage: node grpc_js_calls.js '{"address": "127.0.0.1:PORT", "calls": [{"path", "body"}]}'
//   body: base64 of the request message. Calls run one after the other on one channel.
// Prints one JSON array: per call {code, details, body (base64 of the response, or null)}.

const grpc = require('@grpc/grpc-js');

const cfg = JSON.parse(process.argv[2]);
const client = new grpc.Client(cfg.address, grpc.credentials.createInsecure());
const same = (buffer) => buffer;

function call(spec) {
  return new Promise((resolve) => {
    const deadline = new Date(Date.now() + (spec.deadlineMs || 5000));
    const request = Buffer.from(spec.body, 'base64');
    client.makeUnaryRequest(spec.path, same, same, request, { deadline }, (err, reply) => {
      if (err) {
        resolve({ code: err.code, details: err.details, body: null });
      } else {
        resolve({ code: 0, details: '', body: reply.toString('base64') });
      }
    });
  });
}

(async () => {
  const results = [];
  for (const spec of cfg.calls) {
    results.push(await call(spec));
  }
  client.close();
  process.stdout.write(JSON.stringify(results) + '\n');
})();
