"""A CPU-bound HTTP server for real_programs_test.py, run by Debian's python3:
GET /work?n=N answers sum(k*k % 1000003 for k < N), computed in Python code
(so the interpreter's eval loop is hot). Listens on 127.0.0.1, a port the
kernel picks, and prints "ready PORT" once it accepts.

One thread serves every request, as a plain http.server does: the
ThreadingHTTPServer's thread per request would end before any sampler picks
it up (the default tool scans for new threads every 100 ms)."""
import http.server
import sys
import urllib.parse


def remora_real_work(n):
    s = 0
    for k in range(n):
        s += k * k % 1000003
    return s


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        url = urllib.parse.urlsplit(self.path)
        query = urllib.parse.parse_qs(url.query)
        if url.path != "/work" or "n" not in query:
            self.send_error(404)
            return
        body = b"%d\n" % remora_real_work(int(query["n"][0]))
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass  # one line per request on stderr would only slow the test


class Server(http.server.HTTPServer):
    request_queue_size = 64  # the test's clients connect at once


server = Server(("127.0.0.1", 0), Handler)
sys.stdout.write("ready %d\n" % server.server_address[1])
sys.stdout.flush()
server.serve_forever()
