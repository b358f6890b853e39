"""The monitor's exports: the Prometheus textfile, the calendar feeds and the
page of the week, kept current once a minute when the configuration names
their directories (``prometheus_textfile_dir``, ``calendar_dir``,
``html_dir``).

The facts that shape it:

* The monitor already holds everything an export needs: the ledger it
  re-reads when the file changes, the latest look with its attributions and
  activity judgements, its own heartbeat, and every minute record it folds.
  So the export is assembled from memory (``bk.service.exports.assemble``,
  the same function as ``bk export``), never by reading those files again.
  Today's use counters are read from the history once, at the first export
  (and at each UTC midnight start afresh), then advanced by each minute
  record as the monitor closes it.
* The archive (the calendar's last 14 days, the page's week) is read only
  when the ledger changed since the last read, or a day passed.
* Each file is published with the store's atomic replace
  (``bk.store.publish``), and only when its bytes changed: a calendar of
  unchanged bookings is the same bytes every minute (its DTSTAMPs are the
  bookings' own), so subscribers and web servers see nothing new.
* Per-user feeds are ``users/NAME.ics`` for every user with a booking in
  the calendar's period; a file left for a user who has none any more gets
  an empty calendar once (a subscriber then sees the events go), and is
  removed when the account no longer exists.  A user name that is not a
  plain file name is written as ``uid-UID.ics``.
* A failure (a directory that breaks the owner rule, a full disk) makes
  the heartbeat ``degraded`` with the reason, as any other failure of the
  monitor; the next minute tries again.
"""

from __future__ import annotations

import os
import re

from bk.core.errors import BkError

EVERY_S = 60
PROM_FILE = "gpubk.prom"
PAGE_FILE = "index.html"
ALL_FEED = "all.ics"
USERS_DIR = "users"
_SAFE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,63}")
DAY = 86400


def feed_name(user: str, uid: int) -> str:
    return f"{user}.ics" if _SAFE_NAME.fullmatch(user) and not user.endswith(".") else f"uid-{uid}.ics"


class Exporter:
    """Built by the monitor from its settings; ``step`` once per sample."""

    def __init__(self, settings, *, usage=None, store=None, owner: int | None = None, tz=None,
                 host: str | None = None, generator: str = "bk"):
        from bk.service.exports import host_name

        self.settings = settings
        self.prom_dir = settings["prometheus_textfile_dir"]
        self.ics_dir = settings["calendar_dir"]
        self.html_dir = settings["html_dir"]
        self.user_label = bool(settings["prometheus_user_label"])
        self.publish_users = bool(settings["calendar_publish_users"])
        self.usage = usage                   # bk.store.usage.UsageStore, or None
        self.store = store                   # the ledger Store (for the archive)
        self.owner = owner
        self.tz = tz
        self.host = host or host_name()
        self.generator = generator
        self.last_at: int | None = None
        self.summary = None                  # today's totals (bk.core.usage.Summary), or None: not read
        self.summary_day: int | None = None
        self._archive_key = None
        self._archived: list = []
        self._written: dict[str, bytes] = {}  # path -> the bytes last published there
        self._events: dict = {}               # the calendar renderer's cache of unchanged events

    @property
    def enabled(self) -> bool:
        return bool(self.prom_dir or self.ics_dir or self.html_dir)

    def due(self, t: int) -> bool:
        return self.enabled and (self.last_at is None or t - self.last_at >= EVERY_S or t < self.last_at)

    # -- today's counters

    def fold(self, records) -> None:
        """Closed minute records, as the monitor makes them."""
        if self.summary is None or not records:
            return
        for r in records:
            if r.t - r.t % DAY == self.summary_day:
                self.summary.add(r)

    def _today(self, t: int):
        day = t - t % DAY
        if self.summary is not None and self.summary_day == day:
            return self.summary
        from bk.core.usage import Summary

        self.summary_day = day
        if self.usage is None:
            self.summary = Summary()
            return self.summary
        try:
            self.summary = self.usage.summary(day, t + 60)
        except BkError:
            self.summary = Summary()
        return self.summary

    # -- the archive

    def _archive(self, state, since: int) -> list:
        key = (getattr(state, "seq", None), since - since % DAY)
        if self.store is None or key == self._archive_key:
            return self._archived
        try:
            self._archived = self.store.archived(since=key[1])
            self._archive_key = key
        except BkError:
            self._archived = []
        return self._archived

    # -- one export

    def step(self, t: int, *, state, snapshot, attributions, activity, heartbeat, policy) -> list[str]:
        """Write every configured export; the problems, in words ([] when all
        went well)."""
        from bk.service import exports

        self.last_at = t
        problems: list[str] = []
        hot = list(state.reservations) if state is not None else []
        since = t
        if self.ics_dir:
            since = min(since, exports.period_start("ics", t, self.tz))
        if self.html_dir:
            since = min(since, exports.week_start(t, self.tz))
        reservations = hot
        if since < t and state is not None:
            ids = {r.id for r in hot}
            reservations = hot + [r for r in self._archive(state, since) if r.id not in ids]
        data = exports.assemble(
            now=t, host=self.host, policy=policy, reservations=reservations,
            blackouts=getattr(state, "blackouts", ()), notices=getattr(state, "notices", ()),
            gpus=snapshot.gpus if snapshot is not None else (),
            live_at=snapshot.taken_at if snapshot is not None else None,
            live_source=snapshot.source if snapshot is not None else None, attributions=attributions,
            activity=activity, heartbeat=heartbeat, summary=self._today(t) if self.prom_dir else None,
            since=since, user_of=exports.account_name)
        if self.prom_dir:
            from bk.export import prom

            self._put(problems, "the Prometheus textfile", self.prom_dir, PROM_FILE,
                      prom.render(data, user_names=self.user_label).encode())
        if self.ics_dir:
            self._calendars(problems, data)
        if self.html_dir:
            from bk.clock import describe_zone
            from bk.export import html

            self._put(problems, "the page of the week", self.html_dir, PAGE_FILE,
                      html.render(data, tz=self.tz, zone_name=describe_zone(self.tz)["name"],
                                  week_start=exports.week_start(t, self.tz), generator=self.generator))
        return problems

    def _calendars(self, problems: list[str], feed) -> None:
        from bk.core.record import replace
        from bk.export import ics
        from bk.service import exports

        if len(self._events) > 8 * len(feed.bookings) + 64:   # bookings that went: forget their events
            self._events = {}
        cache = self._events
        self._put(problems, "the calendar feed", self.ics_dir, ALL_FEED,
                  ics.render(feed, name=f"GPU bookings on {feed.host}", busy=False, cache=cache))
        users_dir = os.path.join(self.ics_dir, USERS_DIR)
        owners = {}
        for b in feed.bookings:
            owners.setdefault(b.uid, b.user)
        wanted = {}
        for uid, user in owners.items():
            mine = exports.only(feed, uid=uid)
            wanted[feed_name(user, uid)] = (uid, ics.render(mine, name=f"{user}'s GPU bookings on {feed.host}",
                                                            cache=cache))
        from bk.store.publish import listing, remove

        try:
            present = [n for n in listing(users_dir, owner=self.owner) if n.endswith(".ics")]
        except BkError as e:
            problems.append(f"cannot list the per-user calendars: {e.message}")
            present = []
        empty = replace(feed, bookings=())
        for name in present:
            if name in wanted:
                continue
            uid = _uid_of(name)
            if uid is None:
                try:
                    remove(users_dir, name, owner=self.owner)
                except BkError as e:
                    problems.append(f"cannot remove {os.path.join(users_dir, name)}: {e.message}")
                self._written.pop(os.path.join(users_dir, name), None)
                continue
            wanted[name] = (uid, ics.render(empty, name=f"{name[:-4]}'s GPU bookings on {feed.host}"))
        for name, (uid, body) in sorted(wanted.items()):
            self._put(problems, f"the calendar of uid {uid}", users_dir, name, body,
                      reader=None if self.publish_users else uid)

    def _put(self, problems: list[str], what: str, directory: str, name: str, data: bytes, *,
             reader: int | None = None) -> None:
        from bk.store import publish

        path = os.path.join(directory, name)
        key = path + ("" if reader is None else f"#acl{reader}")
        if self._written.get(key) == data and os.path.exists(path):
            return
        try:
            if key not in self._written:      # the first write here: a killed writer's temp file goes
                publish.clear_leftovers(directory, (name,), owner=self.owner)
            publish.publish(directory, name, data, owner=self.owner, reader=reader)
            self._written[key] = data
        except BkError as e:
            problems.append(f"cannot write {what}: {e.message}")


def _uid_of(feed: str) -> int | None:
    """The account a feed file is named after, if it still exists."""
    import pwd

    from bk.service.exports import account_name

    stem = feed[:-4]
    if stem.startswith("uid-") and stem[4:].isdigit():
        uid = int(stem[4:])
        return uid if account_name(uid) is not None else None
    try:
        return pwd.getpwnam(stem).pw_uid
    except KeyError:
        return None
