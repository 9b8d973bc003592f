"""``GET /health`` of a node every 20 ms until SIGTERM; writes the latencies (ms) as JSON,
a failed request (no answer, not 200) as -1.

Run by ``bench/burst_bench.py`` as a process of its own: ``burst_poll.py PORT OUT``.
"""

from __future__ import annotations

import http.client
import json
import signal
import sys
import time


def main() -> None:
    port, out = int(sys.argv[1]), sys.argv[2]
    latencies: list[float] = []
    running = True

    def stop(*_: object) -> None:
        nonlocal running
        running = False

    signal.signal(signal.SIGTERM, stop)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    while running:
        started = time.perf_counter()
        try:
            conn.request("GET", "/health")
            answer = conn.getresponse()
            answer.read()
            latencies.append(
                (time.perf_counter() - started) * 1000 if answer.status == 200 else -1.0
            )
        except OSError:
            latencies.append(-1.0)
            conn.close()
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        time.sleep(0.02)
    with open(out, "w") as fh:
        json.dump(latencies, fh)


if __name__ == "__main__":
    main()
