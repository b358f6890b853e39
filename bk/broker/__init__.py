"""The shared-server broker: the one process that writes the shared ledger.

  handlers.py  the operation allowlist; each request becomes one service call
               with the caller's identity from SO_PEERCRED
  server.py    the Unix socket, start-up checks, stale sockets, SIGTERM

The wire format and the client are in bk/ipc (shared with the service layer).
docs/SECURITY.md describes the threat model these modules implement.
"""
