"""A payments provider for the effect tests, run as its own process.

`POST /refunds` with an `Idempotency-Key` applies a refund once per key (a repeat returns
the same refund). `GET /refunds/<key>` looks a refund up by key (404: never applied).
`POST /mode` sets how the next refunds behave:
- `ok`: apply and answer;
- `drop`: apply, then close the connection without an answer (the worker cannot tell);
- `refuse`: answer 422 and apply nothing;
- `blind`: like `drop`, and lookups answer 503 (the provider cannot be asked);
- `lost`: close the connection without applying anything, and lookups answer 503.
`GET /count` is how many refunds exist. Prints `port: N` once listening.
"""

from __future__ import annotations

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

STATE = {"mode": "ok", "refunds": {}}
LOCK = threading.Lock()


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args: object) -> None:  # quiet
        pass

    def _answer(self, status: int, body: object) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802
        if self.path == "/count":
            with LOCK:
                return self._answer(200, {"count": len(STATE["refunds"])})
        if self.path.startswith("/refunds/"):
            key = self.path[len("/refunds/") :]
            with LOCK:
                if STATE["mode"] in ("blind", "lost"):
                    return self._answer(503, {"error": "lookups unavailable"})
                refund = STATE["refunds"].get(key)
            if refund is None:
                return self._answer(404, {"error": "no refund under this key"})
            return self._answer(200, refund)
        self._answer(404, {"error": "no such path"})

    def do_POST(self) -> None:  # noqa: N802
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}")
        if self.path == "/mode":
            with LOCK:
                STATE["mode"] = body["mode"]
            return self._answer(200, {"mode": body["mode"]})
        if self.path != "/refunds":
            return self._answer(404, {"error": "no such path"})
        key = self.headers.get("Idempotency-Key")
        if not key:
            return self._answer(400, {"error": "Idempotency-Key required"})
        with LOCK:
            mode = STATE["mode"]
            if mode == "refuse":
                return self._answer(422, {"error": "refund declined"})
            if mode == "lost":
                # Never applied, and the caller cannot tell.
                self.close_connection = True
                self.connection.shutdown(2)
                return
            refund = STATE["refunds"].setdefault(
                key,
                {"refund_id": f"rf_{len(STATE['refunds']) + 1}", "order": body.get("order"),
                 "amount_cents": body.get("amount_cents")},
            )
        if mode in ("drop", "blind"):
            # Applied, but the caller never hears it.
            self.close_connection = True
            self.connection.shutdown(2)
            return
        self._answer(201, refund)


def main() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    print(f"port: {server.server_address[1]}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    sys.exit(main())
