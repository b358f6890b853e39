"""Start-up stays cheap: ``bk --version`` loads no argparse, and an everyday
read (``bk l``) loads no curses, no socket servers, no NVML and none of the
long-running parts (TUI, broker, monitor, worker, MCP).  Each check runs in
a fresh interpreter and looks at ``sys.modules`` after ``main()``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

PROBE = """
import contextlib, io, json, sys
from bk.cli.main import main
with contextlib.redirect_stdout(io.StringIO()) as out:
    code = main(sys.argv[1:])
print(json.dumps({"code": code, "modules": sorted(sys.modules), "out": out.getvalue()}))
"""


def loaded(tmp_path, *argv) -> tuple[int, set[str], str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BK_", "XDG_"))}
    env.update({"HOME": str(tmp_path), "BK_DATA_DIR": str(tmp_path / "data"), "BK_GPU_COUNT": "2",
                "XDG_STATE_HOME": str(tmp_path / "state"), "XDG_CONFIG_HOME": str(tmp_path / "cfg"),
                "PYTHONPATH": str(ROOT)})
    proc = subprocess.run([sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=60)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout.splitlines()[-1])
    return doc["code"], set(doc["modules"]), doc["out"]


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
import contextlib, io, json, sys
before = set(sys.modules)
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
from bk.cli.main import main
with contextlib.redirect_stdout(io.StringIO()) as out:
    code = main(sys.argv[1:])
new = sorted(set(sys.modules) - before)
print(json.dumps({"code": code, "new": new, "who": {m: who.get(m, "?") for m in new}}))
"""

# What every command may import from the standard library (3.10 to 3.13 spell `re` and a
# few others differently).  argparse brings gettext; its lookups, which would import locale,
# are switched off (bk.cli.app).
STDLIB = frozenset({
    "__future__", "_collections", "_datetime", "_functools", "_json", "_operator",
    "_sre", "_struct", "argparse", "codecs", "collections", "collections.abc", "contextlib",
    "copyreg", "datetime", "enum", "errno", "fcntl", "functools", "gc", "gettext", "io",
    "itertools", "json", "json.decoder", "json.encoder", "json.scanner", "keyword",
    "math", "operator", "pwd", "re", "re._casefix", "re._compiler", "re._constants", "re._parser",
    "reprlib", "sre_compile", "sre_constants", "sre_parse", "struct", "time", "types", "warnings",
    "zlib",
})

# The bk modules every everyday command runs: the CLI's parser and renderer, the time
# grammar, the service's call context and the ledger's read.
BK_BASE = frozenset({
    "bk", "bk.cli", "bk.cli.app", "bk.cli.common", "bk.cli.main", "bk.cli.render", "bk.clock",
    "bk.core", "bk.core.envelope", "bk.core.errors", "bk.core.lazyre", "bk.core.ledgerdoc", "bk.core.models",
    "bk.core.record", "bk.core.safetext", "bk.core.telemetry", "bk.core.timegrid", "bk.core.utctime", "bk.gpu",
    "bk.gpu.sim", "bk.service", "bk.service.app", "bk.service.context",
    "bk.service.telemetry", "bk.service.views", "bk.store",
    "bk.store.config", "bk.store.fsutil", "bk.store.ledger", "bk.store.lock", "bk.store.paths",
})
_STATUS = {"bk.cli.cmd_status", "bk.service.status", "bk.store.snapshot"}
_PLACE = {"bk.core.capacity", "bk.core.scheduler", "bk.service.booking", "bk.service.builders",
          "bk.service.fields", "bk.service.requests", "bk.service.results", "bk.service.specs"}
_WRITE = _PLACE | {"bk.core.policy", "bk.service.gateway",
                   "bk.service.notices", "bk.service.ops", "bk.store.archive", "bk.store.audit",
                   "bk.store.segments", "textwrap"}
_SLOTS = _PLACE | {"bk.cli.cmd_slots", "bk.service.advice", "bk.service.status", "bk.store.snapshot",
                   "shlex"}

EVERYDAY: dict[str, frozenset[str]] = {
    "l": frozenset({"bk.cli.cmd_list"}),
    "st": frozenset(_STATUS | {"textwrap"}),
    "g": frozenset(_SLOTS | {"textwrap"}),
    "n": frozenset({"bk.cli.cmd_notices", "bk.cli.cmd_status", "bk.service.status"}),
    "1 30m": frozenset(_WRITE | {"bk.cli.cmd_book", "bk.service.presets", "bk.store.snapshot", "shlex"}),
    "e 1 -d +30m": frozenset(_WRITE | {"bk.cli.cmd_edit"}),
    "d 1 -y": frozenset(_WRITE | {"bk.cli.cmd_cancel"}),
    "slots 2 1h": frozenset(_SLOTS),
    "tl": frozenset({"bk.cli.cmd_timeline", "bk.service.builders", "bk.service.fields", "bk.service.requests",
                     "bk.service.specs", "bk.service.status", "bk.service.timeline", "string",
                     "_string", "textwrap"}),
}


def imports_of(tmp_path, *argv) -> tuple[int, list[str], dict[str, str]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BK_", "XDG_"))}
    env.update({"HOME": str(tmp_path), "BK_DATA_DIR": str(tmp_path / "data"), "BK_GPU_COUNT": "2",
                "XDG_STATE_HOME": str(tmp_path / "state"), "XDG_CONFIG_HOME": str(tmp_path / "cfg"),
                "PYTHONPATH": str(ROOT), "TZ": "UTC"})   # a UTC server needs no zoneinfo
    proc = subprocess.run([sys.executable, "-c", WHO_PROBE, *argv], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=60)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout.splitlines()[-1])
    return doc["code"], doc["new"], doc["who"]


@pytest.mark.parametrize("words", list(EVERYDAY))
def test_everyday_command_imports_only_its_allowlist(tmp_path, words):
    argv = words.split()
    if argv[0] in ("e", "d"):                   # they need a booking to act on
        assert imports_of(tmp_path, "1", "30m")[0] == 0
    code, new, who = imports_of(tmp_path, *argv)
    assert code == 0, f"bk {words} exited {code}"
    allowed = STDLIB | BK_BASE | EVERYDAY[words]
    extra = [f"{m} (imported by {who[m]})" for m in new
             if m not in allowed and not m.startswith("encodings.")]
    assert not extra, f"bk {words} imported modules outside its allowlist: {', '.join(extra)}"


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
