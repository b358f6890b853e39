"""Receivers for notification tests (no tests here): a mail relay that keeps
what it is sent, written with ``socketserver`` (``smtpd`` is gone from
3.12), and an ``http.server`` that captures webhooks, answers with a chosen
status, or hangs until released.  Both listen on loopback, on a port the
kernel picks."""

from __future__ import annotations

import email
import json
import socketserver
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class SmtpSink(socketserver.ThreadingTCPServer):
    """Enough SMTP for ``smtplib``: EHLO, MAIL, RCPT (refusing ``refuse``),
    DATA, RSET, NOOP, QUIT.  ``messages``: ``email.message.Message`` objects."""

    allow_reuse_address = True
    daemon_threads = True

    def __init__(self, refuse: tuple[str, ...] = ()):
        self.refuse = set(refuse)
        self.messages: list = []
        self.rcpt_checks: list[str] = []
        self.lock = threading.Lock()
        super().__init__(("127.0.0.1", 0), _SmtpHandler)
        self.port = self.server_address[1]
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.shutdown()
        self.server_close()


class _SmtpHandler(socketserver.StreamRequestHandler):
    def reply(self, line: str) -> None:
        self.wfile.write((line + "\r\n").encode())

    def handle(self) -> None:
        srv: SmtpSink = self.server
        self.reply("220 sink ESMTP")
        rcpts: list[str] = []
        while True:
            raw = self.rfile.readline(4096)
            if not raw:
                return
            cmd = raw.decode("utf-8", "replace").strip()
            verb = cmd.split(" ", 1)[0].upper()
            if verb in ("EHLO", "HELO"):
                self.reply("250 sink")
            elif verb == "MAIL":
                rcpts = []
                self.reply("250 ok")
            elif verb == "RCPT":
                addr = cmd.split(":", 1)[1].strip().strip("<>")
                with srv.lock:
                    srv.rcpt_checks.append(addr)
                if addr in srv.refuse:
                    self.reply("550 5.1.1 no such user here")
                else:
                    rcpts.append(addr)
                    self.reply("250 ok")
            elif verb == "DATA":
                self.reply("354 go ahead")
                lines = []
                while True:
                    line = self.rfile.readline(1 << 20)
                    if not line or line in (b".\r\n", b".\n"):
                        break
                    lines.append(line[1:] if line.startswith(b"..") else line)
                with srv.lock:
                    srv.messages.append(email.message_from_bytes(b"".join(lines)))
                self.reply("250 queued")
            elif verb in ("RSET", "NOOP"):
                self.reply("250 ok")
            elif verb == "QUIT":
                self.reply("221 bye")
                return
            else:
                self.reply("502 not implemented")


class HookCapture(ThreadingHTTPServer):
    """Captures POSTs: ``hits`` (path, headers dict, parsed JSON body).
    ``status``: what it answers; ``hang``: hold each request (after reading
    it) until ``release()``; ``connected`` counts requests being handled."""

    daemon_threads = True

    def __init__(self, status: int = 200, hang: bool = False):
        self.status, self.hang = status, hang
        self.hits: list = []
        self.connected = 0
        self.lock = threading.Lock()
        self.released = threading.Event()
        super().__init__(("127.0.0.1", 0), _HookHandler)
        self.port = self.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/hook"
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)
        self.thread.start()

    def release(self) -> None:
        self.released.set()

    def close(self) -> None:
        self.release()
        self.shutdown()
        self.server_close()


class _HookHandler(BaseHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass

    def do_POST(self) -> None:
        srv: HookCapture = self.server
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n)
        with srv.lock:
            srv.hits.append((self.path, dict(self.headers), json.loads(body)))
            srv.connected += 1
        try:
            if srv.hang:
                srv.released.wait(60)
            self.send_response(srv.status)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")
        finally:
            with srv.lock:
                srv.connected -= 1
