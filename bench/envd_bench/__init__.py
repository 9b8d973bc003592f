"""envd benchmark: command round trip, file throughput and idle memory (``make bench``).

Starts one envd in a throwaway bubblewrap root (tests/envd/harness.py) -- the built bundle at
build/envd-bundle when it exists, else the source tree -- and drives it with the official Python
SDK in debug mode, exactly as the conformance tests do. Alongside each SDK number it measures the
layers underneath, so a miss can be attributed without a profiler:

* latency: SDK ``commands.run("true")``; the same Connect ``Start`` stream sent raw with httpx
  (no SDK); ``Start`` of ``/bin/true`` (no shell) as the default user and as root (root needs no
  uid switch); the bare spawn of the same commands timed by a loop inside the sandbox; a raw
  unary ``process.Process/List`` and ``GET /health`` (the HTTP + RPC floor);
* throughput: 100 MiB up (multipart bytes, octet-stream bytes, octet-stream iterator) and down
  (bytes, stream), content verified by SHA-256 once per variant;
* memory: RSS and PSS of the envd process after start, after the latency runs and after the
  file transfers (each after a settle pause).

Writes bench/results/envd.json and prints a markdown report (copied into docs/benchmarks.md).
Client and envd share the machine's cores, as they would on a 2 vCPU sandbox host.

The parts, one module each, run by ``__main__`` in this order: ``memory`` (finding envd and
reading its memory, between the parts), ``latency``, ``throughput``; ``raw`` holds the Connect
calls sent without the SDK, ``common`` the targets, result types and the interleaved timer,
``report`` the targets' verdicts and the markdown.
"""
