"""Configuration: one table of keys, a strict loader, and the trust check.

Every key bk understands is in ``KEYS`` with its type, default, allowed range
and whether it is security-relevant.  The man page gpubk-config(5) is tested
against this table, so a key cannot exist undocumented.

Security keys (where the data lives, which socket, which accounts) decide
whom bk trusts.  They are read only from the trusted system file: a file that
root owns, that nobody else can write, in directories that only root can
change.  Otherwise any user who could write the file, or swap a directory
above it, could point everybody's bk at a ledger of their choosing.
"""

from __future__ import annotations

import os
import stat

from bk.core import jsonfast
from bk.core.errors import ConfigError
from bk.core.models import Policy
from bk.core.record import dataclass
from bk.store.fsutil import unsafe_ancestor, unsafe_stat
from bk.store.paths import DEFAULT_SOCKET, Locations


@dataclass(frozen=True, bulk=True)     # the table below makes 66 at every start
class Key:
    name: str
    kind: str                 # "int" | "float" | "bool" | "str" | "path" | "int_list" | "uid_list" | "priority_map" | "choice"
    #                           | "limits" | "limit_tiers" | "member_list" (bk.core.limits parses them)
    #                           | "name_list" (names from choices) | "minutes_list" | "quiet" (HH:MM-HH:MM) | "email"
    default: object
    doc: str
    lo: float | None = None
    hi: float | None = None
    security: bool = False
    choices: tuple[str, ...] = ()
    nullable: bool = False


# bk.core.notify names these too; repeated so that loading the configuration
# (every command) does not load the notification rules (tests/test_notify.py
# checks that they agree).
NOTIFY_EVENTS = ("starts_soon", "started", "ends_soon", "ended", "changed", "moved_earlier",
                 "can_start_earlier", "gpu_used_by_other", "idle_nudge")
NOTIFY_CHANNELS = ("terminal", "desktop", "email", "webhook")

KEYS: dict[str, Key] = {k.name: k for k in (
    Key("gpu_count", "int", None, "Number of GPUs to schedule. Default: detected (NVML) or simulated.",
        1, 64, nullable=True),
    Key("simulated_gpus", "bool", False, "This server's GPUs are simulated on purpose (a trial or CI "
        "server without GPUs): gpu_count GPUs scheduled by share slots alone, no driver looked for, and "
        "no fault reported for the missing telemetry. Needs gpu_count."),
    Key("slot_minutes", "int", 5, "Slice length in minutes; bookings start and last whole slices. "
        "A divisor of 60.", 1, 60),
    Key("max_shared_users", "int", 2, "Share slots per GPU (how many shared bookings fit at once).", 1, 64),
    Key("shared_memory_reserve_mb", "int", 512, "VRAM per GPU kept out of the shared budget, in MiB.",
        0, 1 << 20),
    Key("require_shared_memory", "bool", False, "Shared bookings must state their per-GPU memory (-m)."),
    Key("booking_horizon_days", "int", 30, "Bookings must end within this many days.", 1, 366),
    Key("max_booking_hours", "int", 720, "Longest allowed booking, in hours.", 1, 8784),
    Key("queue_search_hours", "int", 168, "How far ahead placement searches for a free start.", 1, 8784),
    Key("disabled_gpus", "int_list", [], "GPU indices never placed (still monitored)."),
    Key("gpu_priority", "priority_map", {}, 'Placement preference per GPU index, lower first: {"3": 1}.'),
    Key("ledger_retention_days", "int", 90, "Ended and cancelled bookings stay in history this long.",
        1, 3650),
    Key("archive_after_hours", "int", 24, "Ended and cancelled bookings leave the hot ledger after "
        "this many hours (into the archive).", 1, 8784),
    Key("usage_raw_days", "int", 14, "Days of usage history kept per minute; older days are rolled "
        "up into hourly records.", 1, 3650),
    Key("usage_retention_days", "int", 400, "Usage history older than this many days is deleted.",
        1, 36500),
    Key("audit_retention_days", "int", 400, "Sealed audit log segments are kept this long after their "
        "newest record, then deleted.", 1, 36500),
    Key("backup_keep", "int", 10, "Rotated ledger backups to keep.", 0, 1000),
    Key("lock_timeout_seconds", "float", 10.0, "Longest wait for the ledger lock before 'busy'.", 0.1, 600),
    Key("idle_nudge_minutes", "int_list", [30, 45], "Minutes of idle time (no compute and no CPU "
        "work by the booking's processes, see bk u) after which the owner of a running booking is "
        "nudged, once per threshold and idle streak.", 1, 10080),
    Key("idle_release_minutes", "int", None, "Release (end) every running booking idle this many "
        "minutes, as the administrator's policy; unset: only bookings that opted in are released.",
        5, 10080, nullable=True),
    # Lab policy (issue 27, bk.core.limits): per-user limits, bookings that move earlier, fair share.
    Key("limits", "limits", {}, 'Per-user limits: {WHO: {LIMIT: VALUE}}, WHO "*" (everyone), a user, '
        "a tier of limit_tiers or an @group; LIMIT gpus, gpu_hours, booking_hours, ahead_hours or "
        "shared_vram_gib (null: no limit). Root and limit_exempt have none."),
    Key("limit_tiers", "limit_tiers", {}, 'Named sets of users and @groups for limits: '
        '{"students": ["@students", "dave"]}.'),
    Key("limit_exempt", "member_list", [], "Users and @groups no limit applies to (root never has any)."),
    Key("advance_default", "bool", False, "A queued booking moves to an earlier start on its own when "
        "capacity frees (as with --advance), unless booked with --no-advance."),
    Key("fair_share", "bool", False, "Several advancing bookings that want the same capacity go in "
        "order of their owners' decayed past usage (least first) instead of first come, first served."),
    Key("fair_share_half_life_days", "float", 7.0, "How fast past usage is forgotten for fair share: "
        "usage this many days old counts half.", 0.1, 365),
    Key("price_per_kwh", "float", None, "Energy price per kWh (in your currency) for bk u's cost column: "
        "the GPUs' energy (the driver's counter) times pue times this; unset: no cost shown.", 0, 1e6,
        nullable=True),
    Key("gco2_per_kwh", "float", None, "Grams of CO2-equivalent per kWh of the supply, for bk u's CO2e "
        "column (times pue); unset: no CO2e shown.", 0, 1e5, nullable=True),
    Key("pue", "float", 1.0, "Power usage effectiveness of the machine room: the facility's energy per "
        "unit of IT energy, applied to cost and CO2e (1.0: the GPUs' energy alone).", 1.0, 5.0),
    Key("ledger_bookings_per_user", "int", 200, "Shared mode: the most bookings one user may have live "
        "or cancelled within archive_after_hours; more are refused (ledger_limit, exit 3). 0: no limit. "
        "The administrator is exempt.", 0, 1_000_000),
    Key("ledger_bookings_per_minute", "int", 60, "Shared mode: the most bookings one user may make in 60 "
        "seconds. 0: no limit. The administrator is exempt.", 0, 1_000_000),
    Key("ledger_note_bytes_per_user", "int", 16384, "Shared mode: the most bytes the notes on one user's "
        "bookings may take in the hot ledger. 0: no limit. The administrator is exempt.", 0, 1 << 30),
    # Exports (issue 28): what the monitor keeps current every minute, each off until set.
    Key("prometheus_textfile_dir", "path", None, "The monitor writes gpubk.prom there every minute "
        "(node_exporter --collector.textfile.directory); a directory the monitor account owns.",
        nullable=True),
    Key("prometheus_user_label", "bool", False, "Metrics name the booker (label user) and the per-user "
        "families are exported; off: no metric names a person."),
    Key("calendar_dir", "path", None, "The monitor keeps iCalendar feeds there every minute: all.ics "
        "(every booking) and users/NAME.ics (each user's own); a directory the monitor account owns.",
        nullable=True),
    Key("calendar_publish_users", "bool", False, "Per-user feeds are readable by everyone (a web server "
        "may publish them); off: each is readable by its user alone (a POSIX ACL)."),
    Key("html_dir", "path", None, "The monitor writes the page of the week there (index.html) every "
        "minute; a directory the monitor account owns, for a web server to publish.", nullable=True),
    Key("worker_termination_grace_seconds", "int", 5, "A scheduled command gets SIGTERM this many "
        "seconds before its booking ends and SIGKILL at the end (also bk run -- CMD).", 0, 3600),
    # Notifications (bk notify): the defaults every user gets, and the relay.
    Key("notify_events", "name_list", list(NOTIFY_EVENTS), "Events users are told of unless they choose "
        "otherwise (bk notify set --events).", choices=NOTIFY_EVENTS),
    Key("notify_channels", "name_list", ["terminal", "desktop"], "Channels used unless a user chooses "
        "otherwise: terminal, desktop, email, webhook.", choices=NOTIFY_CHANNELS),
    Key("notify_start_minutes", "minutes_list", [10], "Minutes before a "
        "booking starts that its owner is told."),
    Key("notify_end_minutes", "minutes_list", [30, 15, 5], "Minutes before a booking "
        "ends that its owner is told (with the extend command when the calendar allows it)."),
    Key("notify_quiet_hours", "quiet", None, "Local hours (HH:MM-HH:MM) in which pop-ups, email and "
        "webhooks are held back, unless a user sets their own.", nullable=True),
    Key("notify_smtp_host", "str", None, "The mail relay for email notifications; unset: no email.",
        nullable=True),
    Key("notify_smtp_port", "int", 25, "The mail relay's port.", 1, 65535),
    Key("notify_smtp_starttls", "bool", False, "Use STARTTLS with the mail relay."),
    Key("notify_mail_from", "email", None, "The sender of notification mail (default bk@ this host's "
        "name).", nullable=True),
    Key("notify_email_domain", "str", None, "Mail domain of the local accounts: a user who chose the "
        "email channel but no address gets USER@this domain.", nullable=True),
    Key("notify_webhook_allow_private", "bool", False, "Allow webhooks to loopback, link-local and "
        "private addresses (a lab's own chat server); by default only public addresses."),
    Key("notify_timeout_seconds", "float", 10.0, "How long one email or webhook delivery may take "
        "before it counts as failed (and is retried, at most three times).", 1, 120),
    Key("cluster_parallel", "int", 128, "bk c: the most nodes asked at once (ssh processes running "
        "together); the others wait for a free place, each node within its own timeout_s.", 1, 1024),
    Key("admin_contact", "str", None, "Who to ask about this server (shown by bk info).", nullable=True),
    Key("data_dir", "path", None, "Data directory (shared mode). Default /var/lib/gpubk.",
        security=True, nullable=True),
    Key("socket", "path", DEFAULT_SOCKET, "Broker socket path.", security=True),
    Key("service_uid", "int", None, "UID of the service account that runs the broker and owns the data.",
        0, 2**32 - 1, security=True, nullable=True),
    Key("service_gid", "int", None, "GID of the service account.", 0, 2**32 - 1, security=True,
        nullable=True),
    Key("monitor_uid", "int", None, "UID the monitor daemon runs as (default: service_uid).",
        0, 2**32 - 1, security=True, nullable=True),
    Key("access", "choice", "all", "Who may use the broker: all users (socket 0666) or one group (0660).",
        security=True, choices=("all", "group")),
    Key("group", "str", None, "The group allowed when access is 'group'.", security=True, nullable=True),
    # Hard enforcement (bk admin enforce, issue 31): off unless the administrator turns it on.
    Key("enforce", "bool", False, "GPU device access follows the bookings (gpubk-enforcer.service); "
        "set by bk admin enforce on|off.", security=True),
    Key("enforce_failure", "choice", "open", "When the enforcer dies or cannot read the ledger: open "
        "(every GPU opens) or closed (no managed GPU opens).", security=True, choices=("open", "closed")),
    Key("enforce_bypass", "uid_list", [], "UIDs never restricted (root, the service and monitor "
        "accounts always are).", security=True),
    Key("enforce_signal", "bool", False, "Signal processes that keep a GPU open without a booking: "
        "SIGTERM, then SIGKILL after enforce_signal_grace_seconds.", security=True),
    Key("enforce_signal_grace_seconds", "int", 30, "Seconds between SIGTERM and SIGKILL (enforce_signal).",
        1, 3600, security=True),
    Key("enforce_state_dir", "path", "/var/lib/gpubk-enforcer", "The enforcer's status, events and lock "
        "(its unit's StateDirectory=).", security=True),
    Key("enforce_cgroup_root", "path", None, "Where cgroup v2 is mounted (default: found in "
        "/proc/self/mountinfo).", security=True, nullable=True),
)}


@dataclass(frozen=True)
class Settings:
    """The effective configuration: locations plus every key's value."""

    locations: Locations
    values: dict
    source: str | None           # the file read, or None for defaults only
    explicit: frozenset = frozenset()   # the keys the file itself set

    def __getitem__(self, name: str) -> object:
        return self.values[name]

    @property
    def mode(self) -> str:
        return self.locations.mode

    @property
    def data_dir(self) -> str:
        return self.locations.data_dir

    def ledger_limits(self):
        """One user's share of the shared ledger (``bk.core.ledgerlimits``)."""
        from bk.core.ledgerlimits import LedgerLimits

        v = self.values
        return LedgerLimits(v["ledger_bookings_per_user"], v["ledger_bookings_per_minute"],
                            v["ledger_note_bytes_per_user"], v["archive_after_hours"])

    def policy(self, gpu_count: int) -> Policy:
        v = self.values
        return Policy(
            gpu_count=v["gpu_count"] or gpu_count,
            slot_minutes=v["slot_minutes"],
            max_shared_users=v["max_shared_users"],
            shared_memory_reserve_mb=v["shared_memory_reserve_mb"],
            require_shared_memory=v["require_shared_memory"],
            booking_horizon_days=v["booking_horizon_days"],
            max_booking_hours=v["max_booking_hours"],
            queue_search_hours=v["queue_search_hours"],
            disabled_gpus=frozenset(v["disabled_gpus"]),
            gpu_priority=tuple(sorted((int(g), p) for g, p in v["gpu_priority"].items())),
            limits=self.limit_rules(),
            advance_default=v["advance_default"],
            fair_share_half_life_s=(int(v["fair_share_half_life_days"] * 86400) if v["fair_share"] else None),
        )

    def limit_rules(self):
        """The lab's per-user limits (``bk.core.limits``), None when there are none."""
        v = self.values
        if not v["limits"]:
            return None
        from bk.core.limits import LimitRules, parse_members, parse_rules, parse_tiers

        return LimitRules(parse_rules(v["limits"]), parse_tiers(v["limit_tiers"]),
                          parse_members(v["limit_exempt"], "limit_exempt"))


def _bad(name: str, expected: str, got: object, source: str) -> ConfigError:
    return ConfigError(f"{source}: {name} must be {expected}, got {jsonfast.dumps(got)}",
                       hint=f"fix {name} in {source} (see man 5 gpubk-config)",
                       details={"key": name, "expected": expected})


def _num(x) -> str:
    """A bound as people write it: 1048576, not 1.04858e+06; 0.5 stays 0.5."""
    return str(int(x)) if float(x).is_integer() else repr(float(x))


def check_value(key: Key, value: object, source: str) -> object:
    """Return the value normalised, or raise ConfigError saying what was expected."""
    if value is None and key.nullable:
        return None
    kind = key.kind
    if kind == "bool":
        if not isinstance(value, bool):
            raise _bad(key.name, "true or false", value, source)
        return value
    if kind in ("int", "float"):
        ok = isinstance(value, int) and not isinstance(value, bool)
        if kind == "float":
            ok = ok or isinstance(value, float)
        if not ok:
            raise _bad(key.name, "a whole number" if kind == "int" else "a number", value, source)
        if (key.lo is not None and value < key.lo) or (key.hi is not None and value > key.hi):
            raise _bad(key.name, f"between {_num(key.lo)} and {_num(key.hi)}", value, source)
        if key.name == "slot_minutes" and 60 % value:
            raise _bad(key.name, "a divisor of 60 (1, 2, 3, 4, 5, 6, 10, 12, 15, 20, 30, 60)", value, source)
        return float(value) if kind == "float" else value
    if kind in ("str", "choice"):
        if not isinstance(value, str) or not value:
            raise _bad(key.name, "a non-empty string", value, source)
        if kind == "choice" and value not in key.choices:
            raise _bad(key.name, "one of " + ", ".join(key.choices), value, source)
        return value
    if kind == "path":
        if not isinstance(value, str) or not os.path.isabs(value):
            raise _bad(key.name, "an absolute path", value, source)
        return os.path.normpath(value)
    if kind == "int_list":
        lo, hi = (0, 63) if key.lo is None else (key.lo, key.hi)
        if not isinstance(value, list) or not all(isinstance(x, int) and not isinstance(x, bool)
                                                  and lo <= x <= hi for x in value):
            what = "a list of GPU indices (0-63)" if key.lo is None else \
                f"a list of whole numbers from {_num(lo)} to {_num(hi)}"
            raise _bad(key.name, what, value, source)
        return sorted(set(value))
    if kind == "uid_list":
        if not isinstance(value, list) or not all(isinstance(x, int) and not isinstance(x, bool)
                                                  and 0 <= x < 2 ** 32 for x in value):
            raise _bad(key.name, "a list of UIDs (0-4294967295)", value, source)
        return sorted(set(value))
    if kind == "priority_map":
        if not isinstance(value, dict):
            raise _bad(key.name, 'an object of GPU index -> priority, e.g. {"3": 1}', value, source)
        out = {}
        for k, p in value.items():
            if not (isinstance(k, str) and k.isdigit() and int(k) < 64):
                raise _bad(key.name, "GPU indices (0-63) as keys", k, source)
            if not isinstance(p, int) or isinstance(p, bool) or not -100 <= p <= 100:
                raise _bad(key.name, "priorities between -100 and 100", p, source)
            out[k] = p
        return out
    if kind in ("limits", "limit_tiers", "member_list"):
        from bk.core import limits

        try:
            if kind == "limits":
                limits.parse_rules(value)
            elif kind == "limit_tiers":
                limits.parse_tiers(value)
            else:
                limits.parse_members(value, key.name)
        except ValueError as e:
            raise ConfigError(f"{source}: {e}", hint=f"fix {key.name} in {source} (see man 5 gpubk-config)",
                              details={"key": key.name, "expected": key.doc}) from None
        return value
    if kind in ("name_list", "minutes_list", "quiet", "email"):
        from bk.core import notify as N

        try:
            if kind == "name_list":
                return list(N.check_names(value, key.choices, key.name.rsplit("_", 1)[-1].rstrip("s")))
            if kind == "minutes_list":
                return list(N.check_minutes(value, key.name))
            if kind == "email":
                return N.check_email(value)
            N.parse_quiet(value)
            return value.strip()
        except N.Invalid as e:
            raise ConfigError(f"{source}: {key.name}: {e}", hint=(f"{e.hint}; " if e.hint else "")
                              + f"fix {key.name} in {source} (see man 5 gpubk-config)",
                              details={"key": key.name}) from None
    raise AssertionError(kind)


def parse_document(doc: object, source: str, *, allow_security: bool) -> dict:
    """Validate one configuration document; unknown keys are errors with a suggestion."""
    if not isinstance(doc, dict):
        raise ConfigError(f"{source}: expected a JSON object of settings",
                          hint='example: {"slot_minutes": 5, "max_shared_users": 2}')
    out = {}
    for name, value in doc.items():
        key = KEYS.get(name)
        if key is None:
            import difflib

            close = difflib.get_close_matches(name, KEYS, n=1)
            hint = f"did you mean {close[0]!r}?" if close else "see man 5 gpubk-config for the keys"
            raise ConfigError(f"{source}: unknown setting {name!r}", hint=hint)
        if key.security and not allow_security:
            raise ConfigError(f"{source}: {name!r} is accepted only from the trusted system file",
                              hint="set it in /etc/gpubk/config.json (root-owned)")
        out[name] = check_value(key, value, source)
    if out.get("simulated_gpus") and out.get("gpu_count") is None:
        raise ConfigError(f"{source}: simulated_gpus is true but gpu_count is not set",
                          hint='say how many GPUs to simulate: "gpu_count": 8')
    if out.get("access") == "group" and not out.get("group"):
        raise ConfigError(f"{source}: access is 'group' but no group is named",
                          hint='add "group": "gpu-users"')
    return out


def check_trusted(path: str) -> None:
    """Raise ConfigError unless ``path`` and every directory above it are
    root-owned and not writable by group or others.

    A sticky world-writable directory (like /tmp) is accepted above a
    root-owned 0755 directory: the sticky bit stops others from renaming or
    removing entries they do not own, so they cannot swap our subtree.
    """
    real = os.path.realpath(path)
    if real != os.path.abspath(path):
        # The kernel resolves "link/.." through the link, so the text of the
        # path says nothing about the directories really above the file.
        raise ConfigError(f"untrusted config {path}: its path goes through a symbolic link",
                          hint=f"name the file by its real path, {real}")
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise ConfigError(f"configuration file {path} does not exist",
                          hint="run: sudo bk admin init, or unset BK_CONFIG_FILE") from None
    except OSError as e:
        raise ConfigError(f"cannot read configuration file {path}: {e.strerror}") from None
    # Hard links are allowed: another name cannot change what root owns and
    # nobody else may write (the store refuses them for a different reason:
    # bk would append to someone else's file).
    found = unsafe_stat(st, 0, want_dir=False, single_link=False)
    if found is not None:
        raise _untrusted(path, st, found)
    # The file's own directory must not be writable by others at all.
    bad = unsafe_ancestor(os.path.dirname(os.path.abspath(path)), (0,), sticky_ok=False)
    if bad is None:
        return
    directory, dst, why = bad
    if why == "unreadable":
        raise ConfigError(f"untrusted config {path}: cannot inspect {directory}")
    if why == "not a directory":
        raise ConfigError(f"untrusted config {path}: {directory} is a symbolic link or not a directory")
    if why == "owner":
        raise ConfigError(f"untrusted config {path}: directory {directory} is owned by uid "
                          f"{dst.st_uid}, not root", hint=f"sudo chown root {directory}")
    raise ConfigError(f"untrusted config {path}: directory {directory} is writable by "
                      "group or others", hint=f"sudo chmod go-w {directory}")


def _untrusted(path: str, st: os.stat_result, found: tuple[str, str]) -> ConfigError:
    why, problem = found
    if stat.S_ISLNK(st.st_mode):
        return ConfigError(f"untrusted config {path}: it is a symbolic link",
                           hint="replace the link with the file itself")
    if why == "kind":
        return ConfigError(f"untrusted config {path}: {problem}")
    if why == "owner":
        return ConfigError(f"untrusted config {path}: owned by uid {st.st_uid}, not root",
                           hint=f"sudo chown root:root {path}")
    return ConfigError(f"untrusted config {path}: writable by group or others "
                       f"(mode {stat.S_IMODE(st.st_mode):04o})", hint=f"sudo chmod 644 {path}")


def _read_json(path: str) -> object:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise ConfigError(f"cannot open configuration file {path}: {e.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        raw = f.read(1 << 20)
    try:
        return jsonfast.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path} is not valid JSON: {e}", hint="check it with: python3 -m json.tool "
                          + path) from None


def load(locations: Locations) -> Settings:
    """Read the configuration named by ``locations`` and merge it over the defaults."""
    values = {name: key.default for name, key in KEYS.items()}
    path = locations.config_file
    source = None
    explicit: frozenset = frozenset()
    if path:
        if locations.config_is_system:
            check_trusted(path)
        doc = _read_json(path)
        if doc is not None:
            given = parse_document(doc, path, allow_security=locations.config_is_system)
            values.update(given)
            source, explicit = path, frozenset(given)
        elif locations.config_is_system:
            raise ConfigError(f"configuration file {path} does not exist")
    if locations.mode == "shared":
        data_dir = values["data_dir"] or locations.data_dir
        locations = Locations(locations.mode, data_dir, path, True, locations.state_dir, locations.cache_dir,
                              locations.config_dir)
    return Settings(locations, values, source, explicit)


def _account(uid: int) -> str:
    from bk.users import user_name

    return user_name(uid) or f"uid {uid}"


def check_owned_dir(path: str, uid: int, what: str) -> os.stat_result:
    """``path`` is a real directory owned by ``uid``, not writable by group
    or others (the store's rule, ``unsafe_stat``), below directories that
    only root or ``uid`` can change (a sticky directory such as /tmp is fine
    above a safe one)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise ConfigError(f"the {what} {path} does not exist",
                          hint="create it with: sudo bk admin init") from None
    found = unsafe_stat(st, uid, want_dir=True)
    if found is not None:
        why, problem = found
        if why == "kind":
            raise ConfigError(f"the {what} {path} is not a real directory: {problem}",
                              hint="point the config at a real directory")
        if why == "owner":
            raise ConfigError(f"the {what} {path} is owned by {_account(st.st_uid)}, not by the "
                              f"service account {_account(uid)}", hint=f"sudo chown {_account(uid)} {path}")
        raise ConfigError(f"the {what} {path} is {problem.removeprefix('it is ')}",
                          hint=f"sudo chmod go-w {path}")
    bad = unsafe_ancestor(os.path.dirname(path), (0, uid))
    if bad is None:
        return st
    directory, dst, _why = bad
    shown = f"owner {_account(dst.st_uid)}, mode {stat.S_IMODE(dst.st_mode):04o}" if dst else "unreadable"
    raise ConfigError(f"the {what} {path} lies below {directory}, which others can change ({shown})",
                      hint="move it below root-owned directories, e.g. /var/lib/gpubk")
