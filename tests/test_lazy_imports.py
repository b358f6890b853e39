"""Start-up stays cheap: ``bk --version`` loads no argparse, and an everyday
read (``bk l``) loads no curses, no socket servers, no NVML and none of the
long-running parts (TUI, broker, monitor, worker, MCP).  Each check runs in
a fresh interpreter and looks at ``sys.modules`` after ``main()``.

What an interpreter loads before the first line of a program differs from
one installation to the next: Debian's /usr/bin/python3 loads 34 modules,
a pyenv build with an editable install and a few ``.pth`` files over 100
(``re``, ``bisect``, ``typing``...), and a module already loaded is invisible
to an import check.  So every probe runs with ``-I -S``: isolated (no
``PYTHON*`` variables, no user site, no script directory on ``sys.path``)
and without running ``site``, so that no ``.pth`` file, sitecustomize or
virtual environment loads anything first.  The probe then imports ``site``
itself, which under ``-S`` runs none of that and loads only the handful of
modules every start-up has (``os``, ``stat``, ``posixpath``...).  That start-up
is measured in the same run, with the same interpreter, flags and environment
(``bare_startup``), and everything beyond it is what bk loaded: the same set
on every installation of one Python version, and what a command costs over
``python3 -c pass`` on the barest one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

FLAGS = ("-I", "-S")
# bk's own tree first, then the site-packages directories of the running
# interpreter (without their .pth files), so that an optional import such as
# pynvml would still be found and seen.
SEARCH_PATH = "\n".join([str(ROOT), *(p for p in sys.path if p.endswith(("site-packages", "dist-packages")))])

# The interpreter's own start-up, then with site's modules (``import site``
# under -S: no site.main(), so no .pth file, sitecustomize or site-packages).
BARE = "import sys; print(*sorted(sys.modules)); import site; print(*sorted(sys.modules))"

# The probes measure before they import anything else: json and the finder
# come after ``before``, and ``io`` is part of every interpreter's start-up.
PROBE = """
import sys
bare = sorted(sys.modules)
import site
before = sorted(sys.modules)
sys.path[:0] = sys.argv.pop(1).split("\\n")
import io
out, real = io.StringIO(), sys.stdout
sys.stdout = out
try:
    from bk.cli.main import main
    code = main(sys.argv[1:])
finally:
    sys.stdout = real
after = sorted(sys.modules)
import json
print(json.dumps({"code": code, "bare": bare, "before": before, "modules": after, "out": out.getvalue()}))
"""


def probe_env(tmp_path, **extra) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BK_", "XDG_"))}
    env.update({"HOME": str(tmp_path), "BK_DATA_DIR": str(tmp_path / "data"), "BK_GPU_COUNT": "2",
                "XDG_STATE_HOME": str(tmp_path / "state"), "XDG_CONFIG_HOME": str(tmp_path / "cfg"),
                **extra})
    return env


def bare_startup(env: dict[str, str], cwd) -> tuple[set[str], set[str]]:
    """The modules this interpreter has loaded before a program's first line,
    with the probes' flags and environment; and those with site's added."""
    proc = subprocess.run([sys.executable, *FLAGS, "-c", BARE], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=60)
    assert proc.returncode == 0, proc.stderr
    bare, with_site = proc.stdout.splitlines()
    return set(bare.split()), set(with_site.split())


def run_probe(tmp_path, script: str, argv, **extra) -> dict:
    """``script`` run with ``argv`` in a fresh isolated interpreter; its JSON
    answer, with ``new``: the modules loaded beyond the bare start-up."""
    env = probe_env(tmp_path, **extra)
    bare, start = bare_startup(env, tmp_path)
    proc = subprocess.run([sys.executable, *FLAGS, "-c", script, SEARCH_PATH, *argv], capture_output=True,
                          text=True, env=env, cwd=tmp_path, timeout=60)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout.splitlines()[-1])
    # The probe itself loads nothing before it measures: its start-up is the bare one.
    assert (set(doc["bare"]), set(doc["before"])) == (bare, start), (doc["bare"], doc["before"])
    doc["new"] = sorted(set(doc["modules"]) - start)
    return doc


def loaded(tmp_path, *argv) -> tuple[int, set[str], str]:
    doc = run_probe(tmp_path, PROBE, argv)
    return doc["code"], set(doc["new"]), doc["out"]


def test_version_imports_no_argparse(tmp_path):
    code, modules, out = loaded(tmp_path, "--version")
    assert code == 0 and out.startswith("bk ")
    assert "argparse" not in modules
    assert not {m for m in modules if m.startswith(("bk.service", "bk.store", "bk.core.scheduler"))}


def test_list_imports_nothing_heavy(tmp_path):
    code, modules, _ = loaded(tmp_path, "l")
    assert code == 0
    # dataclasses would pull in inspect, ast and tokenize: bk.core.record
    # stands in for it so that every command starts faster.
    banned = {"curses", "_curses", "socketserver", "pynvml", "readline", "dataclasses", "inspect",
              "uuid", "hashlib", "ctypes"}
    heavy = ("bk.tui", "bk.broker", "bk.monitor", "bk.worker", "bk.mcp", "bk.admin", "bk.gpu.nvml",
             "bk.enforce", "bk.core.enforce", "bk.core.devprog", "bk.cli.cmd_enforce")
    found = sorted((modules & banned) | {m for m in modules if m.startswith(heavy)})
    assert not found, f"bk l imported {found}"


# --- each everyday command's import set, bounded -------------------------------------------
#
# Start-up is most of what `bk l` costs (benchmarks/cli.py), and it grows one innocent import
# at a time.  Each everyday command has an explicit allowlist: the bk modules it runs and the
# standard-library modules beyond what every command needs.  A module outside it fails the
# test with the module that imported it; if the new import is truly needed, add it here and
# say in the commit what it costs (python3 -X importtime dist/bk.pyz l).

WHO_PROBE = """
import sys
bare = sorted(sys.modules)
import site
before = sorted(sys.modules)
sys.path[:0] = sys.argv.pop(1).split("\\n")
who = {}


class Who:
    # First on sys.meta_path: sees every import that reaches the finders
    # (each module once, when first imported) and names the importer.
    def find_spec(self, name, path=None, target=None):
        f = sys._getframe(1)
        while f is not None and f.f_code.co_filename.startswith("<frozen"):
            f = f.f_back
        who.setdefault(name, f.f_globals.get("__name__", "?") if f is not None else "?")
        return None


sys.meta_path.insert(0, Who())
import io
out, real = io.StringIO(), sys.stdout
sys.stdout = out
try:
    from bk.cli.main import main
    code = main(sys.argv[1:])
finally:
    sys.stdout = real
after = sorted(sys.modules)
import json
print(json.dumps({"code": code, "bare": bare, "before": before, "modules": after,
                  "who": {m: who.get(m, "?") for m in after}}))
"""

# What the everyday words (bk.cli.fast: bk l, st, n, g, a booking, e, d) may import from
# the standard library: C modules only.  JSON is read and written by bk.core.jsonfast on
# _json (json imports re), datetime's classes come from _datetime (datetime.py runs a pure
# Python implementation first), durations and memory sizes are read by hand-written
# scanners and text is folded by bk.core.textfold (textwrap imports re), and the clock,
# the ledger and the shortcut use neither functools, contextlib, collections nor importlib.
STDLIB_FAST = frozenset({"__future__", "_datetime", "_json", "errno", "gc", "pwd", "zlib"})
# A placement (the scheduler and its capacity index) and a write (the ledger's lock).
_PLACE_STDLIB = {"_bisect", "bisect", "itertools", "operator", "_operator"}
_WRITE_STDLIB = _PLACE_STDLIB | {"fcntl"}

# What every other command may import besides: argparse, with gettext (its lookups, which
# would import locale, are switched off in bk.cli.app) and re (3.10 to 3.13 spell re's
# parts differently; 3.10's imports _locale), and what those import.  importlib (the
# package over the frozen _bootstrap modules every interpreter has) loads the command
# modules there.
STDLIB = STDLIB_FAST | _WRITE_STDLIB | {
    "_collections", "_functools", "_locale", "_sre", "argparse", "collections", "copyreg", "enum",
    "functools", "gettext", "importlib", "importlib._bootstrap", "importlib._bootstrap_external", "keyword",
    "re", "re._casefix", "re._compiler", "re._constants", "re._parser", "reprlib", "sre_compile",
    "sre_constants", "sre_parse", "types", "warnings",
}

# The bk modules every everyday command runs: the CLI's renderer, the time grammar, the
# service's call context and the ledger's read (which takes no lock: bk.store.lock is a
# writer's).
BK_BASE = frozenset({
    "bk", "bk.cli", "bk.cli.common", "bk.cli.main", "bk.cli.render", "bk.clock",
    "bk.core", "bk.core.envelope", "bk.core.errors", "bk.core.jsonfast", "bk.core.lazyre", "bk.core.ledgerdoc",
    "bk.core.models", "bk.core.record", "bk.core.safetext", "bk.core.telemetry", "bk.core.timegrid",
    "bk.core.utctime", "bk.gpu", "bk.gpu.sim", "bk.service", "bk.service.app", "bk.service.context",
    "bk.service.telemetry", "bk.service.views", "bk.store", "bk.store.config", "bk.store.fsutil",
    "bk.store.ledger", "bk.store.paths",
    "bk.users",   # the process actor's account name (one tiny module, no imports of its own)
})
_STATUS = {"bk.cli.cmd_status", "bk.service.status", "bk.store.snapshot", "bk.core.textfold"}
_PLACE = _PLACE_STDLIB | {"bk.core.capacity", "bk.core.scheduler", "bk.service.booking", "bk.service.builders",
                          "bk.service.fields", "bk.service.requests", "bk.service.results", "bk.service.fieldspecs"}
_WRITE = _PLACE | _WRITE_STDLIB | {"bk.core.docparts", "bk.core.ledgercheck", "bk.core.ledgerframe",
                                   "bk.core.policy", "bk.service.gateway", "bk.service.notices", "bk.service.ops",
                                   "bk.store.archive", "bk.store.audit", "bk.store.lock", "bk.store.segments",
                                   "bk.core.textfold"}
_SLOTS = _PLACE | {"bk.cli.cmd_slots", "bk.service.advice", "bk.service.status", "bk.store.snapshot"}

# Issue 27 (bookings shared with the caller, advances in line, the limits a
# write must keep) and issue 25 (the monitor's idle state of running bookings)
# are on the everyday paths: a list shows them, a write keeps them.
_SHARED = {"bk.service.fairview", "bk.core.sharing", "bk.core.limits"}
_FAIR = _SHARED | {"bk.service.advancing", "bk.core.advance", "bk.core.fairshare"}
_WRITE |= _FAIR | {"bk.service.follow"}

EVERYDAY: dict[str, frozenset[str]] = {
    # A running booking's idle state comes from the monitor's activity file (bk.store.snapshot).
    "l": frozenset({"bk.cli.cmd_list", "bk.service.activity", "bk.store.snapshot"} | _FAIR),
    # With a running booking, what the usage history says of it (read without re or hashlib).
    "st": frozenset(_STATUS | {"bk.service.activity", "bk.store.usage", "bk.core.usage", "bk.core.usagecheck"}
                    | _SHARED),
    "g": frozenset(_SLOTS | {"bk.core.textfold"} | _SHARED),
    "n": frozenset({"bk.cli.cmd_notices", "bk.cli.cmd_status", "bk.service.status"}),
    "1 30m": frozenset(_WRITE | {"bk.cli.cmd_book", "bk.service.presets", "bk.store.snapshot"}),
    "e 1 -d +30m": frozenset(_WRITE | {"bk.cli.cmd_edit"}),
    "d 1 -y": frozenset(_WRITE | {"bk.cli.cmd_cancel"}),
    "slots 2 1h": frozenset(_SLOTS),
    "tl": frozenset({"bk.cli.cmd_timeline", "bk.service.builders", "bk.service.fields", "bk.service.requests",
                     "bk.service.fieldspecs", "bk.service.status", "bk.service.timeline", "string",
                     "_string", "bk.core.textfold"}),
}


# The words bk.cli.fast reads run without argparse (and the gettext and re it brings) and
# without bk.cli.app: the shortcut and bk.cli.dispatch stand in for them.
FAST = {"l", "st", "g", "n", "1 30m", "e 1 -d +30m", "d 1 -y"}
BK_FAST = BK_BASE | {"bk.cli.fast", "bk.cli.dispatch"}


def imports_of(tmp_path, *argv, **extra_env) -> tuple[int, list[str], dict[str, str]]:
    doc = run_probe(tmp_path, WHO_PROBE, argv, TZ="UTC", **extra_env)   # a UTC server needs no zoneinfo
    return doc["code"], doc["new"], doc["who"]


@pytest.mark.slow
@pytest.mark.parametrize("words", list(EVERYDAY))
def test_everyday_command_imports_only_its_allowlist(tmp_path, words):
    argv = words.split()
    if argv[0] in ("e", "d"):                   # they need a booking to act on
        assert imports_of(tmp_path, "1", "30m")[0] == 0
    code, new, who = imports_of(tmp_path, *argv)
    assert code == 0, f"bk {words} exited {code}"
    allowed = (STDLIB_FAST | BK_FAST if words in FAST else STDLIB | BK_FAST | {"bk.cli.app"}) | EVERYDAY[words]
    extra = [f"{m} (imported by {who[m]})" for m in new
             if m not in allowed and not m.startswith("encodings.")]
    assert not extra, f"bk {words} imported modules outside its allowlist: {', '.join(extra)}"


@pytest.mark.slow
@pytest.mark.parametrize("words", ["l", "l --all", "st", "n", "g"])
def test_everyday_reads_of_a_ledger_with_bookings_keep_to_the_allowlist(tmp_path, words):
    # The same bounds with bookings to read and show: one running, one later, the
    # ledger decoded, the usage history of the running one looked up.
    assert imports_of(tmp_path, "1", "30m")[0] == 0
    assert imports_of(tmp_path, "2", "1h", "-t", "+3h")[0] == 0
    code, new, who = imports_of(tmp_path, *words.split())
    assert code == 0, f"bk {words} exited {code}"
    allowed = STDLIB_FAST | BK_FAST | EVERYDAY[words.split()[0]]
    extra = [f"{m} (imported by {who[m]})" for m in new if m not in allowed and not m.startswith("encodings.")]
    assert not extra, f"bk {words} imported modules outside its allowlist: {', '.join(extra)}"


@pytest.mark.slow
def test_what_the_interpreter_preloads_changes_nothing(tmp_path):
    # An interpreter whose start-up loads the modules a booking needs (here a
    # sitecustomize, as Debian's and many virtual environments' .pth files do)
    # must not hide them: the verdict is the same on every installation.
    pre = tmp_path / "pre"
    pre.mkdir()
    (pre / "sitecustomize.py").write_text("import bisect, shlex, textwrap, json, argparse\n")
    plain = imports_of(tmp_path, "slots", "2", "1h")
    preloaded = imports_of(tmp_path, "slots", "2", "1h", PYTHONPATH=str(pre), PYTHONSTARTUP=str(pre / "x"))
    assert plain == preloaded
    assert {"bisect", "argparse", "re"} <= set(plain[1])
    loose = subprocess.run([sys.executable, "-c", "import sys; print('bisect' in sys.modules)"],
                           capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(pre)})
    assert loose.stdout.strip() == "True"          # without -I -S it would have been hidden


def test_the_allowlist_catches_an_import_and_names_who(tmp_path):
    # The probe sees what a command imports: `bk help` builds every command's parser.
    code, new, who = imports_of(tmp_path, "help")
    assert code == 0
    assert "bk.cli.cmd_admin" in new and who["bk.cli.cmd_admin"] == "importlib"
    assert who["argparse"] == "bk.cli.app"


def test_utc_zone_without_zoneinfo_matches_zoneinfo():
    # The local zone of most servers is read without importing zoneinfo; it must
    # show what ZoneInfo would.
    import copy
    import pickle
    import zoneinfo
    from datetime import datetime

    from bk import clock

    for key in clock._UTC_KEYS:
        ours, theirs = clock._zone_named(key), zoneinfo.ZoneInfo(key)
        assert isinstance(ours, clock.NamedUTC) and ours.key == theirs.key == str(ours)
        for t in (0, 1_783_939_290, 4_102_444_800):
            a, b = datetime.fromtimestamp(t, ours), datetime.fromtimestamp(t, theirs)
            assert (a.isoformat(), a.tzname(), a.dst(), a.utcoffset()) == \
                   (b.isoformat(), b.tzname(), b.dst(), b.utcoffset())
        assert pickle.loads(pickle.dumps(ours)).key == copy.deepcopy(ours).key == key
    assert clock.find_local_zone("UTC", "/nonexistent").name == "UTC"
    assert clock.find_local_zone(":Etc/UTC", "/nonexistent").to_json() == {"name": "Etc/UTC", "source": "TZ"}
