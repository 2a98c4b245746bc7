#!/usr/bin/env python3
"""A fake Kubernetes API server for tests: HTTPS, answers the TokenReview API only.

    fake_apiserver.py --cert PEM --key PEM --port-file FILE --reviews JSON --caller-token TOKEN
                      [--port N] [--log FILE] [--delay-s S]

--reviews maps a token to the service account and pod it belongs to:
    {"tok-w1": {"username": "system:serviceaccount:stemma:stemma-worker", "pod": "w1",
                "audiences": ["stemma"]}, ...}
Any other token is answered "authenticated": false. A request whose Authorization is not
"Bearer <--caller-token>" gets 401, as a real API server gives an unauthenticated caller.
Tokens starting with "chunked-" are answered with a chunked body. Every request is appended
to --log as one JSON line (path, authorization, token, audiences). The bound port is written
to --port-file once the server listens (port 0: the kernel picks).
"""
import argparse
import http.server
import json
import pathlib
import ssl
import time


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--cert", required=True)
    p.add_argument("--key", required=True)
    p.add_argument("--port", type=int, default=0, help="0: the kernel picks")
    p.add_argument("--port-file", required=True)
    p.add_argument("--reviews", required=True)
    p.add_argument("--caller-token", required=True)
    p.add_argument("--log")
    p.add_argument("--delay-s", type=float, default=0)
    a = p.parse_args()
    reviews = json.loads(pathlib.Path(a.reviews).read_text())

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):  # quiet
            pass

        def reply(self, code: int, obj: dict, chunked: bool = False) -> None:
            body = json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            if chunked:
                self.send_header("Transfer-Encoding", "chunked")
                self.send_header("Connection", "close")
                self.end_headers()
                half = len(body) // 2
                for part in (body[:half], body[half:]):
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
                self.wfile.write(b"0\r\n\r\n")
            else:
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(body)
            self.close_connection = True

        def do_POST(self):
            length = int(self.headers.get("Content-Length", "0"))
            raw = self.rfile.read(length)
            try:
                req = json.loads(raw)
            except ValueError:
                req = {}
            spec = req.get("spec", {})
            token = spec.get("token", "")
            if a.log:
                with open(a.log, "a") as f:
                    f.write(json.dumps({"path": self.path, "authorization": self.headers.get("Authorization"),
                                        "token": token, "audiences": spec.get("audiences")}) + "\n")
            if a.delay_s:
                time.sleep(a.delay_s)
            if self.headers.get("Authorization") != f"Bearer {a.caller_token}":
                self.reply(401, {"kind": "Status", "status": "Failure", "reason": "Unauthorized", "code": 401})
                return
            if self.path != "/apis/authentication.k8s.io/v1/tokenreviews" or req.get("kind") != "TokenReview":
                self.reply(404, {"kind": "Status", "status": "Failure", "code": 404})
                return
            known = reviews.get(token)
            status = {"authenticated": False, "error": "invalid bearer token"}
            if known is not None:
                asked = spec.get("audiences") or []
                granted = [x for x in known.get("audiences", ["stemma"]) if x in asked]
                if granted:
                    user = {"username": known["username"], "uid": "u-" + token,
                            "groups": ["system:serviceaccounts"]}
                    if known.get("pod"):
                        user["extra"] = {"authentication.kubernetes.io/pod-name": [known["pod"]],
                                         "authentication.kubernetes.io/pod-uid": ["uid-" + known["pod"]]}
                    status = {"authenticated": True, "user": user, "audiences": granted}
                else:
                    status = {"authenticated": False, "error": "token audiences do not match"}
            out = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                   "spec": spec, "status": status}
            self.reply(201, out, chunked=token.startswith("chunked-"))

    server = http.server.ThreadingHTTPServer(("127.0.0.1", a.port), Handler)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(a.cert, a.key)
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    tmp = pathlib.Path(a.port_file + ".tmp")
    tmp.write_text(str(server.server_address[1]))
    tmp.rename(a.port_file)
    server.serve_forever()


if __name__ == "__main__":
    main()
