"""``bk update [NEW.pyz]`` and ``sudo bk update --apply``: upgrade an
installed server without losing a booking.

The plan (anyone may look): the installed version (read from the installed
archive, which is world-readable), the new one (NEW.pyz, else the running
bk), and the steps.  Applying (root):

1. stop the services (systemd), or, without systemd, require them stopped
   (the broker socket does not answer, no writer holds a lock) and print
   the commands;
2. keep the installed archive aside (``bk.pyz.previous`` beside it);
3. reconcile: ``bk admin install`` with the new archive and the installed
   settings (config and data untouched: a reconcile never writes them);
4. start the services again;
5. verify with the new archive: ``bk doctor --probe --strict``;
6. on a failed verification put the previous archive back (and its
   manifest entry), restart, and report ``rolled_back`` (exit 1).

The ledger is never touched by any step: the bookings survive an upgrade
and a rollback alike, which the tests check booking by booking.
"""

from __future__ import annotations

import json
import os
import subprocess

from bk.admin import install, install_apply, pyzfile, rootenv, services
from bk.admin import manifest as mf
from bk.admin.layout import Layout, need_root
from bk.admin.tracked import write_file
from bk.core.errors import BkError, Busy, ConfigError
from bk.core.record import dataclass, field, replace


@dataclass
class UpdatePlan:
    layout: Layout
    new_archive: str | None
    new_source: str
    installed_version: str | None
    new_version: str
    python: str | None
    systemd: bool
    steps: list[str] = field(default_factory=list)
    direction: str = "unknown"       # upgrade | same | downgrade | unknown (install.version_order)
    up_to_date: bool = False         # the same version with the same content: nothing to do

    @property
    def downgrade(self) -> bool:
        return self.direction == "downgrade"

    def to_json(self) -> dict:
        return {"root": self.layout.root, "installed_version": self.installed_version,
                "new_version": self.new_version, "new_archive": self.new_source, "systemd": self.systemd,
                "steps": [] if self.up_to_date else self.steps, "direction": self.direction,
                "up_to_date": self.up_to_date}


@dataclass
class UpdateResult:
    plan: UpdatePlan
    status: str                      # updated | rolled_back | up_to_date
    verify: dict
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"status": self.status, **self.plan.to_json(), "verify": self.verify, "notes": self.notes}


def plan(root: str, new_archive: str | None, *, python: str | None = None) -> UpdatePlan:
    layout = Layout(os.path.normpath(root))
    if not os.path.exists(layout.pyz):
        raise ConfigError(f"bk is not installed here: {layout.pyz} is missing",
                          hint="install it first: sudo python3 bk.pyz admin install")
    if new_archive is not None:
        new_archive = os.path.abspath(new_archive)
        entries = pyzfile.read_entries(new_archive)
        source = new_archive
    else:
        entries, source = pyzfile.source_entries(None)
    record = pyzfile.build_record(entries)
    new_version = record.get("version") or "?"
    installed = pyzfile.installed_record(layout.pyz)
    installed_version = installed.get("version") or None
    direction = install.version_order(installed_version, new_version)
    # The same release rebuilt (another commit, a local fix) is not up to
    # date: only the same content is.
    same = direction == "same" and bool(record.get("content_sha256")) \
        and record.get("content_sha256") == installed.get("content_sha256")
    systemd = services.systemd_running(layout.root)
    stop = "stop gpubk-broker and gpubk-monitor" if systemd else \
        "check that the services are stopped (socket, locks); without systemd, stop them yourself first"
    steps = [stop, f"keep the installed archive as {layout.pyz}.previous",
             f"install bk {new_version} from {source} (a reconcile: config and data kept)",
             "start the services again" if systemd else "print the commands that start them",
             "verify with the new archive: bk doctor --probe --strict" + (
                 "" if systemd else " (the new broker unit's ExecStart= run as its User= meanwhile)"),
             "on failure: put the previous archive back and restart"]
    return UpdatePlan(layout, new_archive, source, installed_version, new_version, python, systemd, steps,
                      direction, same)


DIRECTION_WORDS = {"upgrade": "this is an upgrade", "same": "this is the same version, another build",
                   "downgrade": "this is a DOWNGRADE", "unknown": "which of the two is newer cannot be told"}


def plan_text(p: UpdatePlan) -> str:
    lines = [f"installed: bk {p.installed_version or '?'} ({p.layout.pyz})",
             f"new:       bk {p.new_version} ({p.new_source})"]
    if p.up_to_date:
        return "\n".join([*lines, f"already up to date: bk {p.new_version} is installed, with the same content"])
    lines.append(DIRECTION_WORDS[p.direction] + (
        f": bk {p.installed_version} would be replaced by the older bk {p.new_version}" if p.downgrade else ""))
    lines.append("sudo bk update --apply would:")
    lines += [f"  {i}. {s}" for i, s in enumerate(p.steps, 1)]
    return "\n".join(lines)


def result_text(r: UpdateResult) -> str:
    p = r.plan
    if r.status == "up_to_date":
        return f"already up to date: bk {p.new_version} is installed, with the same content; nothing changed"
    if r.status == "updated":
        head = (f"{'downgraded' if p.downgrade else 'updated'} bk {p.installed_version or '?'} -> {p.new_version}; "
                "bk doctor --probe --strict passed")
    else:
        head = (f"the new archive failed its verification; rolled back to bk {p.installed_version or '?'}:\n"
                + verification_text(r.verify))
    return "\n".join([head, *r.notes])


def verification_text(v: dict) -> str:
    """Why the check failed, for people: doctor's checks that are not ok,
    each with its detail and fix, as ``bk doctor`` words them (its JSON is
    for programs: a raw tail of it is cut mid-object).  Without a report
    (doctor did not start, or printed no JSON) the last lines of what it
    printed, whole lines only."""
    report = v.get("doctor")
    checks = report.get("checks") if isinstance(report, dict) else None
    lines = []
    if isinstance(checks, list):
        for c in checks:
            if not isinstance(c, dict) or c.get("ok", True):
                continue
            word = "FAIL" if c.get("status") == "fail" else "WARN"
            lines.append(f"  {c.get('name', '?')}: {word}: {c.get('detail', '')}")
            if c.get("fix"):
                lines.append(f"    fix: {c['fix']}")
    output = v.get("output") or ""
    if lines:
        # What came after doctor's JSON (the temporary broker's own words).
        extra = output.split("\nbroker: ", 1)[1] if "\nbroker: " in output else ""
        if extra:
            lines.append("  broker: " + extra.strip().splitlines()[-1])
        return "\n".join(lines)
    tail = output.strip().splitlines()[-20:]
    return "\n".join("  " + x for x in tail) or f"  bk doctor exited {v.get('rc')} and said nothing"


def verify(layout: Layout, runner=subprocess.run) -> dict:
    """``bk doctor --probe --strict`` as the installed launcher runs it (the
    new archive), as root: in bk's environment, not the caller's (``bk.admin.rootenv``)."""
    run_env = rootenv.environment()
    if layout.root != "/":
        run_env["BK_CONFIG_FILE"] = layout.config
    try:
        p = runner([layout.launcher, "doctor", "--probe", "--strict", "--json"], capture_output=True,
                   text=True, timeout=120, check=False, env=run_env, cwd=rootenv.CWD)
    except (OSError, subprocess.SubprocessError) as e:
        return {"ok": False, "rc": None, "output": str(e)}
    out = (p.stdout or "") + (p.stderr or "")
    checks = None
    try:
        checks = json.loads(p.stdout).get("data")
    except (ValueError, AttributeError):
        pass
    return {"ok": p.returncode == 0 or _only_the_monitor_waits(checks), "rc": p.returncode,
            "output": out[-4000:], "doctor": checks}


def _only_the_monitor_waits(report) -> bool:
    """The update stopped the monitor itself: its heartbeat says ``stopped``
    until the restarted monitor's first sample (with systemd, a second or
    two after the start this check may win the race to), and without
    systemd nothing restarts it.  Under --strict that is a warning that
    fails; it says nothing about the new archive, so it alone must not roll
    the upgrade back.  Any failure, or any other warning, still does."""
    if not isinstance(report, dict) or not isinstance(report.get("checks"), list):
        return False
    bad = [c for c in report["checks"] if isinstance(c, dict) and not c.get("ok")]
    return bool(bad) and all(c.get("name") == "monitor" and c.get("status") == "warn" for c in bad)


def apply(p: UpdatePlan, env: dict, *, runner=subprocess.run, euid: int | None = None) -> UpdateResult:
    need_root("bk update --apply", euid)
    if p.up_to_date:
        return UpdateResult(p, "up_to_date", {"ok": True, "rc": None, "output": ""})
    layout = p.layout
    m = mf.load(layout.config_dir)
    if m is None:
        raise ConfigError(f"no install manifest in {layout.config_dir}; bk update upgrades what bk admin "
                          "install installed", hint="sudo python3 bk.pyz admin install")
    socket_path = m.options.get("socket") or layout.socket
    data_dir = m.options.get("data_dir") or layout.p("/var/lib/gpubk")
    notes: list[str] = []
    if p.systemd:
        services.run(services.stop_commands(), runner)
    running = services.running_writers(socket_path, data_dir)
    if running:
        raise Busy("the services are still running: " + "; ".join(running),
                   hint="stop them first (systemctl stop gpubk-broker gpubk-monitor, or kill -TERM)")
    previous = layout.pyz + ".previous"
    with open(layout.pyz, "rb") as f:
        old = f.read()
    write_file(previous, old, 0o644)
    options = install.Options(root=layout.root, archive=p.new_archive, python=p.python, start=False)
    try:
        ip = install.plan(options, env)
        install_apply.apply(ip, runner=runner)
        if p.systemd:
            services.run(services.start_commands(False, True), runner)
            result = verify(layout, runner)
        else:
            # No systemd to start the broker: run the new unit's ExecStart=
            # as its User= for the length of the check.
            with services.TemporaryService(os.path.join(layout.unit_dir, "gpubk-broker.service"),
                                           socket_path) as broker:
                result = verify(layout, runner)
            if not result["ok"] and getattr(broker, "stderr", ""):
                result["output"] += "\nbroker: " + broker.stderr.strip()[-1000:]
    except BkError as e:                # refused or failed before the check: the previous archive goes back
        result = {"ok": False, "rc": None, "output": f"error: {e.message}"}
    if result["ok"]:
        status = "updated"
    else:
        status = "rolled_back"
        try:
            # Everything back as the previous archive installs it: the
            # archive, and the units, launcher and pages it carries.
            install_apply.apply(install.plan(replace(options, archive=previous), env), runner=runner)
        except ConfigError as e:
            notes.append(f"reinstalling the previous archive failed ({e.message}); put back the archive alone")
            _rollback(layout, old)
    os.unlink(previous)
    if p.systemd and status == "rolled_back":
        ran = services.run(services.start_commands(False, True), runner)
        notes += [f"{r['command']}: {r['stderr']}" for r in ran if r["rc"] != 0]
    elif not p.systemd:
        notes.append("systemd is not running here; start the services with:")
        notes += ["  " + c for c in services.shown(services.start_commands(False, True))]
        notes.append(services.foreground(layout.launcher))
    return UpdateResult(p, status, result, notes)


def _rollback(layout: Layout, old: bytes) -> None:
    """The previous archive back in place, and the manifest saying so."""
    write_file(layout.pyz, old, 0o644)
    m = mf.load(layout.config_dir)
    if m is None:
        return
    e = m.find(layout.pyz)
    if e is not None:
        e.sha256 = mf.sha256_bytes(old)
        mf.save(layout.config_dir, m)
