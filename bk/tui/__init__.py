"""``bk t``: the full-screen timeline, in curses.

The facts that shape it:

* A terminal is a shared, stateful device.  curses switches it to the
  alternate screen, turns echo and line buffering off and hides the cursor;
  whatever ends the process (an exception, SIGTERM, the SIGHUP of a dropped
  SSH session, Ctrl-Z) must hand it back as it was, or the user's shell is
  left blind.  ``driver`` owns that, and nothing else touches curses.
* Reading the world is slow next to drawing it: the ledger is a file the
  writer replaces, the GPUs answer through NVML (which can stall for
  seconds when a GPU falls off the bus), the monitor's heartbeat is another
  file.  A screen that read them per frame would freeze on exactly the
  machine where someone needs to look.  So a background thread (``world``)
  builds a ``World`` once a second from the committed ledger (never the
  lock) and the monitor's snapshot (a backend look at most every few
  seconds when no monitor runs), and the screen draws the latest one.
* What is drawn is a pure function: ``render.render(state, world, size,
  theme, charset) -> Frame`` (lines of (text, attribute) runs), and keys are
  a pure function too: ``keys.handle(state, key, world) -> (state,
  action)``.  Both are tested as text, with fixed clocks and ledgers.
* Writes (book, edit, cancel) are actions the driver hands to ``actions``,
  which builds typed requests (``bk.service.builders``) and calls the
  service layer with a fresh ``Call``: the service validates again at
  submit, so a booking made impossible since the preview is refused with
  its reason on the status line, and nothing is written.
"""
