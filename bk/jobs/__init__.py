"""Scheduled commands: the private job specs, the logs, the launcher and the
per-user worker (SPEC 9).

The facts, and what follows from them:

* The shared ledger is readable by every user of the server (0644): a
  command line there would show everyone the user's paths, data set names
  and, too often, tokens.  So the ledger holds only a job's state and a
  short safe summary (``bk.core.jobs.summary_of``); the argv, working
  directory and PATH live in a spec file in the user's own state directory
  (``$XDG_STATE_HOME/bk/jobs/specs``, 0700 directories, 0600 files), and
  the booking holds the spec's sha256.  The spec holds 32 random bytes
  that appear nowhere else, so that digest confirms no guess of the command
  line.  A spec whose bytes no longer match that digest was changed after
  booking: it is refused and reported, never run (``specs.read_spec``).
* Only the user can start processes as the user (bk never runs setuid), so
  the launcher is a per-user process, the worker (``worker.Worker``), run
  by ``systemctl --user`` (``bk-worker.service``) or by hand (``bk w start``).
  One worker per user and state directory: an ``flock`` on
  ``jobs/worker.lock``, which the kernel drops when the worker dies, even
  by ``kill -9``.
* A job runs in a new session (so a new process group, with no controlling
  terminal): TERM and KILL go to the whole group (``os.killpg``), so a shell
  script's children stop with it.  A child re-parented after the worker
  dies keeps running; the next worker finds it by the exact marker entry
  in its environment (``/proc/PID/environ``, readable by the same user),
  stops it and marks the job ``uncertain``.
* A job's stdout and stderr are a pipe to its log pump (``logpump``), a
  small process of its own that writes ``ID.log`` and starts a new segment
  (the old one becomes ``ID.log.1``) the moment the current one is full:
  the two-segment cap holds at every write, even for a job that writes
  gigabytes and exits within a tick.  The pump is in its own session and
  ends when the job's output closes, so it outlives a worker crash and
  output written then is kept too.

This package does side effects (files, processes) for the service layer:
``bk.service.jobs`` is its only caller.  Its decisions that need no I/O are
in ``bk.core.jobs``.
"""
