"""The broker's wire, shared by both ends: neither the service layer (the
client side) nor the broker (the server side) imports the other.

  protocol.py  length-prefixed JSON frames, their limits and the request shape
  client.py    one request over the Unix socket, with the listener checked
"""
