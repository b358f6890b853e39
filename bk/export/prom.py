"""Bookings and their use as Prometheus metrics (the text exposition format).

The facts that shape it:

* node_exporter's textfile collector reads every ``*.prom`` file of one
  directory at each scrape and serves its samples with its own; it skips a
  file it cannot parse, whole, and says so in ``node_textfile_scrape_error``.
  So the file is written by atomic rename (``bk.store.publish``), and this
  module's output is checked by ``promtool check metrics`` in the tests.
* Prometheus' naming rules: one application prefix (``gpubk_``), base units
  (seconds, joules, ratios 0 to 1, never milli-anything, MiB or percent),
  the unit as the suffix before ``_total``, ``_total`` on counters and only
  on counters, ``_timestamp_seconds`` for points in time, and a label
  instead of a name part for anything that varies (``state="active"``).
  ``lint`` checks all of these on any exposition text; the tests run it on
  what bk writes, and on broken examples, so it can fail.
* Joins: dcgm-exporter labels its per-GPU series ``gpu`` (the index) and
  ``UUID``, spelled so; every per-GPU series here has both, so
  ``gpubk_gpu_booked_ratio * on(UUID) group_left DCGM_FI_DEV_GPU_UTIL``
  works.  dcgm-exporter's ``modelName`` breaks promtool's snake_case rule
  for label names; the model is ``model`` on ``gpubk_gpu_info`` instead,
  next to ``Hostname`` (which passes it), as dcgm-exporter spells that one.
* Counters count since 00:00 UTC, from the usage history: the history is
  what is true, so a monitor restart neither resets nor repeats them, and
  they reset once a day (``rate`` and ``increase`` treat that as any
  counter reset).  ``gpubk_monitor_samples_total`` counts since the
  monitor started.
* User names are personal data: only with ``user_names`` (the
  administrator's ``prometheus_user_label``) do series carry ``user``, and
  the per-user families exist at all.  Without it nothing names a person
  (no uid either: a uid names one as well).
"""

from __future__ import annotations

from bk.core.record import dataclass
from bk.export.model import ACTIVITY_STATES, MONITOR_STATES, Export

PREFIX = "gpubk_"
GPU_LABELS = ("gpu", "UUID")


@dataclass(frozen=True)
class Metric:
    name: str
    type: str              # gauge | counter
    help: str
    labels: tuple = ()     # always present; ``user`` is added where allowed (``personal``)
    personal: bool = False # only with user names allowed


_G, _C = "gauge", "counter"
METRICS: tuple[Metric, ...] = (
    Metric("gpubk_gpu_info", _G, "A GPU bk schedules, always 1; model and Hostname name it.",
           GPU_LABELS + ("model", "Hostname")),
    Metric("gpubk_gpu_share_slots", _G, "Share slots of the GPU: how many shared bookings fit on it at once.",
           GPU_LABELS),
    Metric("gpubk_gpu_disabled", _G, "1 when the policy never places bookings on the GPU.", GPU_LABELS),
    Metric("gpubk_gpu_booked_ratio", _G, "Part of the GPU's share slots held by bookings now, 0 to 1.",
           GPU_LABELS),
    Metric("gpubk_gpu_used_ratio", _G, "Part of the GPU's share slots held by bookings the monitor sees "
           "active now, 0 to 1.", GPU_LABELS),
    Metric("gpubk_gpu_unreserved_processes", _G, "Processes on the GPU whose owner holds no booking on it "
           "now (absent when the processes cannot be listed).", GPU_LABELS),
    Metric("gpubk_gpu_next_booking_timestamp_seconds", _G, "When the next booking on the GPU starts, Unix "
           "time (absent when none is booked).", GPU_LABELS),
    Metric("gpubk_gpu_booked_seconds_total", _C, "Booked GPU seconds on the GPU since 00:00 UTC, one per "
           "booking (two shared bookings for an hour are two hours).", GPU_LABELS),
    Metric("gpubk_gpu_active_seconds_total", _C, "Booked seconds on the GPU since 00:00 UTC in which the "
           "booker's processes ran on it.", GPU_LABELS),
    Metric("gpubk_gpu_unreserved_seconds_total", _C, "GPU seconds used without a booking on the GPU since "
           "00:00 UTC.", GPU_LABELS),
    Metric("gpubk_gpu_energy_joules_total", _C, "Energy the GPU drew since 00:00 UTC, from its energy "
           "counter as the usage history records it.", GPU_LABELS),
    Metric("gpubk_bookings", _G, "Bookings not cancelled: running now (active) or starting later "
           "(upcoming).", ("status",)),
    Metric("gpubk_booking_info", _G, "A booking running now, always 1.", ("reservation", "mode"),
           personal=True),
    Metric("gpubk_booking_share_ratio", _G, "Part of the GPU's share slots the running booking holds, "
           "0 to 1.", ("reservation",) + GPU_LABELS, personal=True),
    Metric("gpubk_booking_start_timestamp_seconds", _G, "When the running booking started, Unix time.",
           ("reservation",), personal=True),
    Metric("gpubk_booking_end_timestamp_seconds", _G, "When the running booking ends, Unix time.",
           ("reservation",), personal=True),
    Metric("gpubk_booking_state", _G, "The monitor's judgement of the running booking: 1 for its state, "
           "0 for the others.", ("reservation", "state"), personal=True),
    Metric("gpubk_booking_idle_seconds", _G, "Seconds the running booking has been seen idle since it was "
           "last seen active.", ("reservation",), personal=True),
    Metric("gpubk_booking_energy_joules_total", _C, "The running booking's part of its GPUs' energy since "
           "00:00 UTC.", ("reservation",), personal=True),
    Metric("gpubk_user_booked_gpus", _G, "GPUs the user's running bookings hold; a shared booking counts "
           "its part of each GPU.", ("user",)),
    Metric("gpubk_user_booked_seconds_total", _C, "The user's booked GPU seconds since 00:00 UTC.",
           ("user",)),
    Metric("gpubk_user_active_seconds_total", _C, "The user's booked GPU seconds since 00:00 UTC in which "
           "their processes ran.", ("user",)),
    Metric("gpubk_user_unreserved_seconds_total", _C, "The user's GPU seconds without a booking since "
           "00:00 UTC.", ("user",)),
    Metric("gpubk_user_energy_joules_total", _C, "The user's part of the GPUs' energy since 00:00 UTC.",
           ("user",)),
    Metric("gpubk_maintenance_active", _G, "1 while a maintenance window is open.", ()),
    Metric("gpubk_maintenance_next_start_timestamp_seconds", _G, "When the next maintenance window "
           "opens, Unix time (absent when none is planned).", ()),
    Metric("gpubk_monitor_state", _G, "The monitor daemon's state: 1 for its state, 0 for the others.",
           ("state",)),
    Metric("gpubk_monitor_heartbeat_age_seconds", _G, "Seconds since the monitor's last sample.", ()),
    Metric("gpubk_monitor_start_timestamp_seconds", _G, "When the monitor started, Unix time.", ()),
    Metric("gpubk_monitor_interval_seconds", _G, "The monitor's sampling interval.", ()),
    Metric("gpubk_monitor_samples_total", _C, "Samples the monitor took since it started.", ()),
    Metric("gpubk_export_timestamp_seconds", _G, "When these metrics were made, Unix time.", ()),
)
BY_NAME = {m.name: m for m in METRICS}


# ------------------------------------------------------------- rendering

def escape_label(value: str) -> str:
    """A label value in the text format: backslash, double quote and line
    feed are the three escapes it has."""
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def number(v) -> str:
    """A sample value: integers exactly, other numbers as Python writes them
    (shortest round-trip), which the format reads back the same."""
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, int):
        return str(v)
    f = float(v)
    if f.is_integer() and abs(f) < 1e15:
        return str(int(f))
    return repr(f)


def _labels(pairs) -> str:
    if not pairs:
        return ""
    return "{" + ",".join(f'{k}="{escape_label(v)}"' for k, v in pairs) + "}"


class _Out:
    def __init__(self):
        self.samples: dict[str, list[str]] = {}

    def add(self, name: str, pairs, value) -> None:
        if value is None:
            return
        self.samples.setdefault(name, []).append(f"{name}{_labels(pairs)} {number(value)}")

    def text(self) -> str:
        lines = []
        for m in METRICS:
            got = self.samples.get(m.name)
            if not got:
                continue
            lines.append(f"# HELP {m.name} {escape_help(m.help)}")
            lines.append(f"# TYPE {m.name} {m.type}")
            lines.extend(got)
        return "\n".join(lines) + "\n" if lines else ""


def render(data: Export, *, user_names: bool = False) -> str:
    """The exposition text of ``data``.  ``user_names``: series carry the
    booker's ``user``, and the per-user families are there."""
    out = _Out()
    cap = max(1, data.capacity)
    running = [b for b in data.bookings if b.status == "active"]
    gpu_keys = {}
    for g in data.gpus:
        key = (("gpu", str(g.index)), ("UUID", g.uuid or ""))
        gpu_keys[g.index] = key
        out.add("gpubk_gpu_info", key + (("model", g.name), ("Hostname", data.host)), 1)
        out.add("gpubk_gpu_share_slots", key, cap)
        out.add("gpubk_gpu_disabled", key, int(g.disabled))
        held = sum(b.slots for b in running if g.index in b.gpus)
        used = sum(b.slots for b in running if g.index in b.gpus and b.activity == "active")
        out.add("gpubk_gpu_booked_ratio", key, min(held, cap) / cap)
        out.add("gpubk_gpu_used_ratio", key, min(used, cap) / cap)
        if g.processes is not None:
            out.add("gpubk_gpu_unreserved_processes", key, len(g.unreserved))
        nxt = min((b.start for b in data.bookings if b.status == "upcoming" and g.index in b.gpus),
                  default=None)
        out.add("gpubk_gpu_next_booking_timestamp_seconds", key, nxt)
        use = data.gpu_use.get(g.index)
        if data.history:
            use = use or _ZERO
            out.add("gpubk_gpu_booked_seconds_total", key, use.booked_s)
            out.add("gpubk_gpu_active_seconds_total", key, use.active_s)
            out.add("gpubk_gpu_unreserved_seconds_total", key, use.unreserved_s)
            out.add("gpubk_gpu_energy_joules_total", key, use.energy_j)
    counts = {"active": 0, "upcoming": 0}
    for b in data.bookings:
        if b.status in counts:
            counts[b.status] += 1
    for status, n in counts.items():
        out.add("gpubk_bookings", (("status", status),), n)
    for b in running:
        who = (("reservation", b.id),) + ((("user", b.user),) if user_names else ())
        out.add("gpubk_booking_info", who + (("mode", b.mode),), 1)
        for i in b.gpus:
            key = gpu_keys.get(i, (("gpu", str(i)), ("UUID", "")))
            out.add("gpubk_booking_share_ratio", who + key, min(b.slots, cap) / cap)
        out.add("gpubk_booking_start_timestamp_seconds", who, b.start)
        out.add("gpubk_booking_end_timestamp_seconds", who, b.end)
        if b.activity is not None:
            for s in ACTIVITY_STATES:
                out.add("gpubk_booking_state", who + (("state", s),), int(s == b.activity))
            out.add("gpubk_booking_idle_seconds", who, b.idle_s)
        if data.history:
            out.add("gpubk_booking_energy_joules_total", who, b.energy_j or 0)
    if user_names:
        held: dict[str, float] = {}
        for b in running:
            held[b.user] = held.get(b.user, 0.0) + len(b.gpus) * min(b.slots, cap) / cap
        for user in sorted(held):
            out.add("gpubk_user_booked_gpus", (("user", user),), round(held[user], 6))
        if data.history:
            for user in sorted(data.user_use):
                u = data.user_use[user]
                pair = (("user", user),)
                out.add("gpubk_user_booked_seconds_total", pair, u.booked_s)
                out.add("gpubk_user_active_seconds_total", pair, u.active_s)
                out.add("gpubk_user_unreserved_seconds_total", pair, u.unreserved_s)
                out.add("gpubk_user_energy_joules_total", pair, u.energy_j)
    now = data.now
    out.add("gpubk_maintenance_active", (), int(any(w.start <= now < w.end for w in data.windows)))
    out.add("gpubk_maintenance_next_start_timestamp_seconds", (),
            min((w.start for w in data.windows if w.start > now), default=None))
    mon = data.monitor
    for s in MONITOR_STATES:
        out.add("gpubk_monitor_state", (("state", s),), int(s == mon.state))
    out.add("gpubk_monitor_heartbeat_age_seconds", (), mon.age_s)
    out.add("gpubk_monitor_start_timestamp_seconds", (), mon.started_at)
    out.add("gpubk_monitor_interval_seconds", (), mon.interval_s)
    out.add("gpubk_monitor_samples_total", (), mon.samples)
    out.add("gpubk_export_timestamp_seconds", (), now)
    return out.text()


class _Zero:
    booked_s = active_s = unreserved_s = 0
    energy_j = None


_ZERO = _Zero()


# ------------------------------------------------------------- the lint

# Unit words that are not base units (the naming guide: seconds, bytes,
# joules, ratios), as whole parts of a name.
NOT_BASE_UNITS = frozenset((
    "ms", "msec", "milliseconds", "us", "microseconds", "ns", "nanoseconds", "minutes", "hours", "days",
    "mib", "gib", "kib", "mb", "gb", "kb", "megabytes", "gigabytes", "kilobytes", "percent", "pct",
    "mw", "milliwatts", "mj", "millijoules", "kwh", "kilowatts", "kilojoules"))
_NAME = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_:"
_LABEL_FIRST = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_"
_DIGITS = "0123456789"


def _valid_name(s: str, first: str, rest: str) -> bool:
    return bool(s) and s[0] in first and all(c in rest for c in s[1:])


def _parse_sample(line: str) -> tuple[str, list[tuple[str, str]], str]:
    """``name{labels} value [timestamp]`` -> (name, [(label, raw value)],
    value text); ValueError on anything the text format does not allow."""
    i = 0
    while i < len(line) and line[i] not in "{ ":
        i += 1
    name, pairs = line[:i], []
    if i < len(line) and line[i] == "{":
        i += 1
        while True:
            if line[i] == "}":
                i += 1
                break
            j = line.index("=", i)
            label = line[i:j]
            if line[j + 1] != '"':
                raise ValueError(f"label {label!r}: value not quoted")
            k, raw = j + 2, []
            while line[k] != '"':
                if line[k] == "\\":
                    if line[k + 1] not in '\\"n':
                        raise ValueError(f"label {label!r}: unknown escape \\{line[k + 1]}")
                    raw.append(line[k:k + 2])
                    k += 2
                else:
                    if line[k] == "\n":
                        raise ValueError(f"label {label!r}: raw line feed")
                    raw.append(line[k])
                    k += 1
            pairs.append((label, "".join(raw)))
            i = k + 1
            if line[i] == ",":
                i += 1
            elif line[i] != "}":
                raise ValueError("labels not separated by commas")
    rest = line[i:].split()
    if not rest or len(rest) > 2:
        raise ValueError("no value, or more than a value and a timestamp")
    float(rest[0])
    return name, pairs, rest[0]


def lint(text: str, *, prefix: str = PREFIX) -> list[str]:
    """Every way ``text`` breaks the exposition format or the naming rules
    (the module docstring); [] when it keeps them all."""
    problems: list[str] = []
    helps: dict[str, str] = {}
    types: dict[str, str] = {}
    seen_series: set = set()
    done: set[str] = set()
    current = None
    if text and not text.endswith("\n"):
        problems.append("the text does not end with a line feed")
    for n, line in enumerate(text.split("\n")[:-1] if text.endswith("\n") else text.split("\n"), 1):
        where = f"line {n}"
        if not line:
            problems.append(f"{where}: empty line")
            continue
        if line.startswith("#"):
            parts = line.split(" ", 3)
            if len(parts) >= 3 and parts[1] in ("HELP", "TYPE"):
                name = parts[2]
                body = parts[3] if len(parts) > 3 else ""
                if name in done:
                    problems.append(f"{where}: {name} appears again after other metrics")
                if parts[1] == "HELP":
                    if name in helps:
                        problems.append(f"{where}: second HELP for {name}")
                    helps[name] = body
                    if not body.strip():
                        problems.append(f"{where}: {name} has an empty HELP")
                    bad = body.replace("\\\\", "").replace("\\n", "")
                    if "\\" in bad:
                        problems.append(f"{where}: {name}: HELP has an escape other than \\\\ and \\n")
                else:
                    if name in types:
                        problems.append(f"{where}: second TYPE for {name}")
                    if name in seen_series:
                        problems.append(f"{where}: TYPE for {name} after its samples")
                    types[name] = body
                    if body not in ("counter", "gauge", "histogram", "summary", "untyped"):
                        problems.append(f"{where}: {name}: unknown type {body!r}")
                if current is not None and current != name:
                    done.add(current)
                current = name
            continue
        try:
            name, pairs, value = _parse_sample(line)
        except (ValueError, IndexError) as e:
            problems.append(f"{where}: not a sample line ({e})")
            continue
        if current is not None and name != current:
            done.add(current)
        if name in done:
            problems.append(f"{where}: {name}'s samples are not together")
        current = name
        seen_series.add(name)
        if not _valid_name(name, _NAME, _NAME + _DIGITS):
            problems.append(f"{where}: {name!r} is not a metric name")
        labels = [k for k, _ in pairs]
        for k in labels:
            if not _valid_name(k, _LABEL_FIRST, _LABEL_FIRST + _DIGITS) or k.startswith("__"):
                problems.append(f"{where}: {name}: {k!r} is not a label name")
        if len(set(labels)) != len(labels):
            problems.append(f"{where}: {name}: a label appears twice")
        key = (name, tuple(sorted(pairs)))
        if key in seen_series:
            problems.append(f"{where}: {name}: the same series twice")
        seen_series.add(key)
        if name.endswith("_ratio") and not 0 <= float(value) <= 1:
            problems.append(f"{where}: {name} is a ratio but its value {value} is outside 0..1")
        if name.endswith("_total") and float(value) < 0:
            problems.append(f"{where}: counter {name} is negative")
    for name in sorted(set(helps) | set(types)):
        problems.extend(f"{name}: {p}" for p in name_problems(name, types.get(name), prefix=prefix))
        if name not in helps:
            problems.append(f"{name}: no HELP")
        if name not in types:
            problems.append(f"{name}: no TYPE")
    for key in seen_series:
        if isinstance(key, str) and key not in types:
            problems.append(f"{key}: samples without HELP and TYPE")
    return problems


def name_problems(name: str, kind: str | None, *, prefix: str = PREFIX) -> list[str]:
    """The naming guide's rules for one metric name of type ``kind``."""
    out = []
    if prefix and not name.startswith(prefix):
        out.append(f"does not start with the application prefix {prefix!r}")
    if name != name.lower():
        out.append("is not snake_case")
    parts = name.split("_")
    for p in parts:
        if p in NOT_BASE_UNITS:
            out.append(f"has the unit {p!r}; use base units (seconds, bytes, joules, ratio)")
    if kind == "counter" and not name.endswith("_total"):
        out.append("is a counter without the _total suffix")
    if kind not in (None, "counter") and name.endswith("_total"):
        out.append(f"ends with _total but is a {kind}")
    for suffix in ("_count", "_sum", "_bucket"):
        if name.endswith(suffix) and kind not in ("histogram", "summary"):
            out.append(f"ends with {suffix}, which histograms and summaries own")
    if "__" in name:
        out.append("has a double underscore")
    units = ("seconds", "joules", "bytes", "ratio", "celsius", "volts", "amperes", "watts", "meters")
    body = name[:-len("_total")] if name.endswith("_total") else name
    for u in units:
        if f"_{u}_" in body + "_" and not body.endswith(f"_{u}"):
            out.append(f"has the unit {u!r} inside the name; it belongs at the end (before _total)")
    if "timestamp" in parts and not name.endswith("_timestamp_seconds"):
        out.append("is a timestamp but does not end with _timestamp_seconds")
    return out
