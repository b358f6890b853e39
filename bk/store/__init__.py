"""Storage: the only code that opens state files.

``fsutil`` (safe opens, atomic and durable writes), ``lock`` (the writers'
flock), ``ledger`` (the Store: transactions, validation, fallback to
backups), ``audit`` (the append-only log and its bounded reverse reader),
``archive`` (monthly history files), plus ``paths``, ``config`` and
``presets``.  docs/ARCHITECTURE.md, section "Storage", describes the files
on disk and the transaction protocol.
"""
