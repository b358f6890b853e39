"""Every everyday command through the built ``bk.pyz``, as a real process
(STYLE 13): the archive is built once per session, then the seed README's
"Everyday use" runs in order on a simulated 4-GPU server, followed by each
other command of this group once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOW_ISO = "2026-07-13T10:41:30Z"


@pytest.fixture
def run(pyz, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BK_", "XDG_"))}
    env.update(BK_DATA_DIR=str(tmp_path / "data"), BK_GPU_COUNT="4", BK_NOW=NOW_ISO, TZ="UTC",
               HOME=str(tmp_path), COLUMNS="80", NO_COLOR="1")
    env.pop("BK_GPU_SIM_FILE", None)

    def bk(*argv: str, code: int = 0, stdout=subprocess.PIPE) -> subprocess.CompletedProcess:
        p = subprocess.run([sys.executable, str(pyz), *argv], env=env, stdout=stdout,
                           stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, timeout=60)
        assert p.returncode == code, (argv, p.returncode, p.stdout, p.stderr)
        assert "Traceback" not in p.stderr
        return p
    return bk


@pytest.mark.slow
def test_readme_everyday_use_then_every_command(run):
    # The seed README, in order (bk a, bk run, bk t and bk u belong to other commands).
    assert run("1", "30m").stdout.startswith("booked 1 GPU (0) shared 07-13 10:40–11:10")
    assert "12g" in run("2", "1h30m", "12g").stdout
    assert "exclusive" in run("x", "1", "2h").stdout
    listing = run("l").stdout.splitlines()
    assert listing[0].split()[:3] == ["#", "ID", "GPUS"] and len(listing) == 4
    assert "export CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=" in run("g").stdout
    four = run("g", "4")                         # GPU 3 is held exclusively until 12:40
    assert "nothing free now" in four.stdout and "12:40" in four.stdout and "bk 4 1h" in four.stdout

    # Every other command of the group, once each.
    assert "NEXT FREE" in run("st").stdout
    assert "▼ now" in run("tl").stdout
    assert "bk 2 1h -g" in run("slots", "2", "1h").stdout
    assert run("e", "1", "-d", "+30m").stdout.startswith("updated")
    hist = run("history", "1").stdout
    assert "booked by" in hist and "edited by" in hist
    assert run("d", "2", "-y").stdout.startswith("cancelled")
    assert run("n").stdout.strip() == "no notices"
    assert "cancelled by" in run("lg").stdout
    assert "administrator" in run("info").stdout
    assert "within the hour" in run("login").stdout
    assert "slot_minutes" in run("config").stdout
    assert "all checks passed" in run("doctor", "--strict").stdout
    assert "5-minute slices" in run("tutorial").stdout
    assert "COMMAND" in run("help").stdout
    assert "NEXT FREE" in run().stdout                   # bare bk without a terminal: status

    env = json.loads(run("--json", "l").stdout)
    assert env["ok"] and env["command"] == "list" and len(env["data"]["reservations"]) == 2
    bad = run("--json", "1", code=2)
    assert json.loads(bad.stdout)["error"]["code"] == "invalid_input" and bad.stderr == ""


def test_closed_pipe_is_quiet(run):
    # The reader is gone before bk writes (`bk tutorial | true`): the first
    # write fails with EPIPE; bk must exit without a traceback.
    r, w = os.pipe()
    os.close(r)
    try:
        p = run("tutorial", stdout=w)
    finally:
        os.close(w)
    assert p.stderr == ""


# The archive's __main__ imports bk's modules with ``Archive`` (zipimport with
# each module's bytecode read once, bk.admin.pyzfile.MAIN_PY).  Every module of
# the archive, imported both ways in fresh interpreters, has the same spec, the
# same module attributes and the same names; a source-only entry, another
# Python's bytecode or --check-hash-based-pycs always still go to zipimport.
ARCHIVE_PROBE = r"""
import json, marshal, sys, zipfile, zipimport
archive, use = sys.argv[1], sys.argv[2]
main = zipfile.ZipFile(archive).read("__main__.py").decode()
ns = {"__name__": "bk_archive_main"}
exec(compile(main, "__main__.py", "exec"), ns)
sys.path.insert(0, archive)
if use == "archive":
    ns["_install"](archive)
names = sorted(n[:-4].replace("/", ".").removesuffix(".__init__") for n in zipfile.ZipFile(archive).namelist()
               if n.startswith("bk/") and n.endswith(".pyc") and not n.startswith("bk/resources/"))
out = {}
for name in names:
    try:
        m = __import__(name, fromlist=["_"])
    except Exception as e:
        out[name] = repr(e)
        continue
    s = m.__spec__
    out[name] = {"type": type(m.__loader__).__name__, "spec": [s.name, s.origin, s.cached, s.parent, s.has_location,
                 s.submodule_search_locations, repr(s.loader), s.loader is m.__loader__],
                 "attrs": [getattr(m, a, None) for a in ("__file__", "__cached__", "__package__", "__path__")],
                 "names": sorted(k for k in vars(m) if k not in ("__spec__", "__loader__", "__builtins__"))}
print(json.dumps(out))
"""


def _imported(pyz, use, *flags):
    proc = subprocess.run([sys.executable, "-I", "-S", *flags, "-c", ARCHIVE_PROBE, str(pyz), use],
                          capture_output=True, text=True, timeout=120, cwd="/")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.mark.slow
def test_the_archive_importer_gives_what_zipimport_gives(pyz):
    # Also with the archive's bytecode checked against its sources, which
    # Archive leaves to zipimport.
    for flags in ((), ("--check-hash-based-pycs", "always")):
        ours, theirs = _imported(pyz, "archive", *flags), _imported(pyz, "zipimport", *flags)
        assert set(ours) == set(theirs) and len(ours) > 150
        loaders = {v["type"] for v in ours.values() if isinstance(v, dict)}
        assert loaders == {"Archive"}, loaders
        for name in ours:
            a, b = ours[name], theirs[name]
            if isinstance(a, dict):
                a = dict(a, type="zipimporter")
            assert a == b, (name, flags)


def test_the_archive_importer_leaves_other_entries_to_zipimport(tmp_path):
    import zipfile

    from bk.admin import pyzfile

    path = tmp_path / "t.pyz"
    foreign = b"\0\0\0\0" + bytes(12) + b"junk"           # another Python's magic number
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("__main__.py", pyzfile.MAIN_PY)
        z.writestr("bk/__init__.py", "")
        z.writestr("bk/src.py", "X = 'source only'\n")
        z.writestr("bk/other.py", "X = 'compiled here'\n")
        z.writestr("bk/other.pyc", foreign)
    script = ("import sys, zipfile; ns = {'__name__': 'x'}; "
              "exec(zipfile.ZipFile(sys.argv[1]).read('__main__.py'), ns); ns['_install'](sys.argv[1]); "
              "sys.path.insert(0, sys.argv[1]); import bk.src, bk.other; "
              "print(bk.src.X, '|', bk.other.X, '|', type(bk.other.__loader__).__name__, bk.other.__file__)")
    proc = subprocess.run([sys.executable, "-I", "-S", "-c", script, str(path)], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split(" | ") == ["source only", "compiled here", f"Archive {path}/bk/other.py\n"]
