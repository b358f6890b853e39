"""The shared-server broker: the one process that writes the shared ledger.

  protocol.py  the wire format: length-prefixed JSON frames and their limits
  handlers.py  the operation allowlist; each request becomes one service call
               with the caller's identity from SO_PEERCRED
  server.py    the Unix socket, start-up checks, stale sockets, SIGTERM
  client.py    what bk clients use to reach it (RemoteService)

docs/SECURITY.md describes the threat model these modules implement.
"""
