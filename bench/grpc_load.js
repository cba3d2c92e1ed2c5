'use strict';
// Closed-loop gRPC unary load generator on Node's built-in http2 module (no npm packages).
//
// Usage: node grpc_load.js '<json config>'
//   config: {url, path, frames, offset, connections, streams, settleS, durationS, latencyFile}
//   frames: file of back-to-back gRPC frames (flag byte, 4-byte length, message); requests
//           cycle through them round-robin, so N frames drive N distinct descriptor values.
// Each of `connections` HTTP/2 connections keeps `streams` requests in flight. Requests that
// complete inside the measurement window (after `settleS`, for `durationS`) are counted and
// their latencies (ms, float64 little-endian) written to `latencyFile`. Every response is
// checked: HTTP 200, grpc-status 0, and a body whose first field is overall_code = OK (1).
// Prints one JSON summary line on stdout, with `next_offset`: where a following run continues
// the rotation, so that successive runs cover every frame.

const http2 = require('node:http2');
const fs = require('node:fs');
const net = require('node:net');
const { performance } = require('node:perf_hooks');

const cfg = JSON.parse(process.argv[2]);
const HEADERS = {
  ':method': 'POST',
  ':path': cfg.path,
  'content-type': 'application/grpc',
  te: 'trailers',
};
const OK_PREFIX = [0x08, 0x01]; // field 1 (overall_code), varint 1 (OK)

function loadFrames(file) {
  const buf = fs.readFileSync(file);
  const frames = [];
  for (let off = 0; off < buf.length; ) {
    const len = buf.readUInt32BE(off + 1);
    frames.push(buf.subarray(off, off + 5 + len));
    off += 5 + len;
  }
  if (frames.length === 0) throw new Error(`no frames in ${file}`);
  return frames;
}

const frames = loadFrames(cfg.frames);
const state = {
  next: (cfg.offset || 0) % frames.length,
  sent: 0, // requests issued, counted or not: how far the rotation moved
  running: true,
  inFlight: 0,
  windowStart: Infinity,
  windowEnd: Infinity,
  done: 0,
  errors: 0,
  firstError: '',
  latencies: new Float64Array(1 << 20),
};

function record(start, end, error) {
  if (end < state.windowStart || end > state.windowEnd) return;
  if (error) {
    state.errors += 1;
    if (!state.firstError) state.firstError = error;
    return;
  }
  if (state.done === state.latencies.length) {
    const bigger = new Float64Array(state.latencies.length * 2);
    bigger.set(state.latencies);
    state.latencies = bigger;
  }
  state.latencies[state.done++] = end - start;
}

function checkBody(head) {
  return head.length >= 7 && head[5] === OK_PREFIX[0] && head[6] === OK_PREFIX[1];
}

function issue(session) {
  if (!state.running || session.closed || session.destroyed) return;
  const frame = frames[state.next];
  state.next = state.next + 1 === frames.length ? 0 : state.next + 1;
  state.sent += 1;
  const start = performance.now();
  let httpStatus = 0;
  let grpcStatus;
  let head = null;
  state.inFlight += 1;
  const req = session.request(HEADERS, { endStream: false });
  req.on('response', (headers) => {
    httpStatus = headers[':status'];
    if (headers['grpc-status'] !== undefined) grpcStatus = headers['grpc-status'];
  });
  req.on('trailers', (trailers) => {
    grpcStatus = trailers['grpc-status'];
  });
  req.on('data', (chunk) => {
    head = head === null ? chunk : head.length < 7 ? Buffer.concat([head, chunk]) : head;
  });
  req.on('error', () => {});
  req.on('close', () => {
    state.inFlight -= 1;
    let error = '';
    if (req.rstCode) error = `stream reset ${req.rstCode}`;
    else if (httpStatus !== 200) error = `HTTP ${httpStatus}`;
    else if (grpcStatus !== '0') error = `grpc-status ${grpcStatus}`;
    else if (head === null || !checkBody(head)) error = 'overall_code not OK';
    record(start, performance.now(), error);
    issue(session);
  });
  req.end(frame);
}

function connect() {
  return new Promise((resolve, reject) => {
    const { hostname, port } = new URL(cfg.url);
    const createConnection = () => net.connect({ host: hostname, port: Number(port), noDelay: true });
    const session = http2.connect(cfg.url, { createConnection });
    session.once('connect', () => resolve(session));
    session.once('error', reject);
  });
}

function sleep(ms) {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

async function drain(limitMs) {
  const deadline = performance.now() + limitMs;
  while (state.inFlight > 0 && performance.now() < deadline) await sleep(10);
}

async function main() {
  const sessions = [];
  for (let i = 0; i < cfg.connections; i += 1) sessions.push(await connect());
  for (const s of sessions) s.on('error', () => {});
  const t0 = performance.now();
  state.windowStart = t0 + cfg.settleS * 1000;
  state.windowEnd = state.windowStart + cfg.durationS * 1000;
  for (const s of sessions) for (let j = 0; j < cfg.streams; j += 1) issue(s);
  await sleep(state.windowEnd - t0);
  state.running = false;
  await drain(5000);
  for (const s of sessions) s.close();
  const lat = state.latencies.subarray(0, state.done);
  fs.writeFileSync(cfg.latencyFile, Buffer.from(lat.buffer, lat.byteOffset, lat.byteLength));
  const summary = {
    requests: state.done,
    errors: state.errors,
    first_error: state.firstError,
    duration_s: cfg.durationS,
    distinct_frames: frames.length,
    sent: state.sent,
    next_offset: state.next,
  };
  process.stdout.write(`${JSON.stringify(summary)}\n`);
  for (const s of sessions) s.destroy();
}

main().catch((err) => {
  process.stderr.write(`grpc_load: ${err && err.stack ? err.stack : err}\n`);
  process.exit(1);
});
