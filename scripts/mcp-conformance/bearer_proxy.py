"""Test harness only (scripts/mcp-conformance.sh): the conformance suite's client
sends no credentials, and Harness Engine's /mcp refuses an unauthenticated request
before the MCP layer. This forwards each request unchanged (Host and Origin too, so the
DNS-rebinding scenario reaches the server's own check) with the test's bearer token
added. Usage: bearer_proxy.py UPSTREAM_BASE_URL TOKEN_FILE PORT_FILE"""

import http.client
import http.server
import socketserver
import sys
import urllib.parse

upstream = urllib.parse.urlsplit(sys.argv[1])
with open(sys.argv[2], encoding="utf-8") as f:
    token = f.read().strip()
port_file = sys.argv[3]
HOP = {"authorization", "connection", "content-length", "transfer-encoding", "keep-alive"}


class Relay(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:
        pass

    def relay(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP}
        headers["Authorization"] = f"Bearer {token}"
        conn = http.client.HTTPConnection(upstream.hostname, upstream.port, timeout=60)
        try:
            conn.request(self.command, self.path, body=body, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
        finally:
            conn.close()
        self.send_response(resp.status)
        for k, v in resp.getheaders():
            if k.lower() not in HOP:
                self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        try:
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the suite closed its side (it does after reading the status)

    do_GET = do_POST = do_DELETE = do_OPTIONS = relay


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True


server = Server(("127.0.0.1", 0), Relay)
with open(port_file, "w", encoding="utf-8") as f:
    f.write(str(server.server_address[1]))
server.serve_forever()
