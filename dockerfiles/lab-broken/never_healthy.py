"""Never-healthy server: accepts llama-server/vLLM-style flags, listens on --port, answers 503."""
import http.server
import json
import sys


def port_from(argv):
    for i, a in enumerate(argv):
        if a == "--port" and i + 1 < len(argv):
            return int(argv[i + 1])
        if a.startswith("--port="):
            return int(a.split("=", 1)[1])
    return 8080


class H(http.server.BaseHTTPRequestHandler):
    def _503(self):
        body = json.dumps({"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}).encode()
        self.send_response(503)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _503

    def log_message(self, fmt, *args):
        sys.stderr.write("never-healthy: " + (fmt % args) + "\n")


if __name__ == "__main__":
    http.server.ThreadingHTTPServer(("0.0.0.0", port_from(sys.argv[1:])), H).serve_forever()
