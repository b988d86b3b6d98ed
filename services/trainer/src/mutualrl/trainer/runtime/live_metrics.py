"""Round metrics sent to SEE in the background (run_metrics.proto), for SEE's live dashboard.

Training never waits on it: `report` only queues the row. A sender thread batches rows to SEE;
while SEE does not answer, rows wait (up to `max_pending`, then the oldest go, counted and
logged: metrics.jsonl keeps every row regardless) and are sent when it is back. `close` flushes
what it can within its timeout.
"""

from __future__ import annotations

import collections
import itertools
import logging
import threading
import time

from mutualrl.client.see import SeeClient, metric_row
from mutualrl.common.channel import ClientOptions

log = logging.getLogger(__name__)


class SeeMetricsReporter:
    def __init__(self, address: str, run_id: str, policy: str, token: str | None = None,
                 timeout: float = 10.0, max_pending: int = 100_000, retry_s: float = 2.0,
                 client: SeeClient | None = None) -> None:
        self.run_id, self.policy = run_id, policy
        # No outage budget: the sender thread retries on its own schedule, rows kept queued.
        self.client = client or SeeClient(ClientOptions(address=address, token=token,
                                                        timeout=timeout, outage_budget=0))
        self._pending: collections.deque[tuple[int, dict[str, float], int]] = \
            collections.deque(maxlen=max_pending)
        self._cond = threading.Condition()
        self._closing = False
        self._retry_s = retry_s
        self.sent = 0
        self.dropped = 0
        """Rows pushed out of a full queue while SEE was unreachable."""
        self.failures = 0
        self._last_ok = True
        self._thread = threading.Thread(target=self._run, name=f"see-metrics-{policy}",
                                        daemon=True)
        self._thread.start()

    def report(self, round_k: int, values: dict[str, float]) -> None:
        with self._cond:
            if len(self._pending) == self._pending.maxlen:
                self.dropped += 1
            self._pending.append((round_k, dict(values), int(time.time() * 1000)))
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._closing:
                    self._cond.wait()
                if not self._pending:
                    return  # closing and nothing left
                batch = list(itertools.islice(self._pending, 1024))
            try:
                self.client.report_metrics(self.run_id, [
                    metric_row(self.policy, k, v, ms) for k, v, ms in batch])
            except Exception as err:  # SEE down, refused, or a bug: training goes on
                self.failures += 1
                self._last_ok = False
                if self.failures == 1 or self.failures % 50 == 0:
                    log.warning("metrics to SEE failed (%d times; rows kept for a retry): %s",
                                self.failures, err)
                with self._cond:
                    if self._closing:
                        return
                    self._cond.wait(self._retry_s)
                continue
            with self._cond:
                self._last_ok = True
                # Only rows of this batch still queued (a full queue may have pushed some out).
                ids = {id(row) for row in batch}
                while self._pending and id(self._pending[0]) in ids:
                    self._pending.popleft()
                self.sent += len(batch)
                self._cond.notify_all()

    def close(self, timeout: float = 5.0) -> None:
        """Send what is queued (within `timeout`), then stop the thread and the channel."""
        deadline = time.monotonic() + timeout
        with self._cond:
            # Wait for the sender while SEE answers; a SEE that just failed is not waited for.
            while self._pending and self._last_ok and time.monotonic() < deadline:
                self._cond.wait(0.05)
            self._closing = True
            self._cond.notify()
        self._thread.join(max(0.0, deadline - time.monotonic()) + 0.5)
        if self._pending:
            log.warning("%d metric rows were not delivered to SEE (metrics.jsonl has them)",
                        len(self._pending))
        self.client.close()
