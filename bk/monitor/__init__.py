"""``bk m``: the GPU monitor daemon (``bk.monitor.daemon``).

One per server.  It looks at the GPUs every two seconds, judges each
process against the bookings, folds the looks into minute records of usage
history, and publishes the latest look as a snapshot file with a heartbeat
(``bk.store.snapshot``), so that ``bk st``, placement and the broker read a
file instead of initialising NVML themselves.
"""
