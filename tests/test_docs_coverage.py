"""The documents cover the tool: the two guides show the same `bk` commands,
the man pages name every command, option, environment variable and config
key, and every JSON field bk prints is in docs/JSON.md or docs/TELEMETRY.md.

The lists are derived from the tool, never written here: the argparse tree
(bk.cli.manpage.walk), the config keys (bk.store.config.KEYS), the BK_*
variables the code reads, and the `--json` output of real commands run
through the built archive on a simulated server."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from bk.cli import manpage
from bk.store.config import KEYS

ROOT = Path(__file__).resolve().parent.parent
EN, ZH = ROOT / "docs" / "GUIDE.md", ROOT / "docs" / "GUIDE.zh-CN.md"
MAN = {name: (ROOT / "man" / name).read_text(encoding="utf-8")
       for name in ("bk.1", "bk-admin.8", "gpubk-config.5")}


# ----------------------------------------------------- commands in a guide

def _tree():
    return manpage.flatten(manpage.walk(manpage._parser()))


def _resolver():
    """words -> canonical command path, by the argparse tree."""
    children: dict[tuple[str, ...], dict[str, str]] = {}
    for c in _tree():
        parent = tuple(c.path[:-1])
        for name in (c.path[-1], *c.aliases):
            children.setdefault(parent, {})[name] = c.path[-1]

    def resolve(words: list[str]) -> str | None:
        words = [w for w in words if not w.startswith("-")][:4] if words else []
        if not words:
            return "bk"
        if re.fullmatch(r"\d+", words[0]):
            return "book"
        if words[0].startswith("@"):
            return "@NODE"
        path: list[str] = []
        for w in words:
            name = children.get(tuple(path), {}).get(w)
            if name is None:
                break
            path.append(name)
        return " ".join(path) or None
    return resolve


CODE_SPAN = re.compile(r"`((?:sudo )?bk(?:\.pyz)? [^`]*|bk)`")
SHOWN = re.compile(r"^(?:\$|ada\$|bob\$|gpubk\$|root#) (?:sudo )?(?:python3 )?(?:\S*/)?bk(?:\.pyz)?(?: (.*))?$")
PROMPT_LINE = re.compile(r"^bk> (.*)$")
PLAIN = re.compile(r"^(?:sudo )?(?:[A-Z_]+=\S+ )*bk(?: (.*))?$")


def _split(text: str) -> list[str]:
    text = text.split(" #", 1)[0].split("  ", 1)[0]    # `bk w start    what it does` in recipes
    try:
        return shlex.split(text)
    except ValueError:
        return text.split()


def guide_commands(path: Path) -> set[str]:
    """The `bk` commands a guide shows: prompts, recipe lines, `bk>` lines and
    inline code, each resolved to its canonical command path."""
    resolve = _resolver()
    found: set[str] = set()
    in_code = False
    for line in path.read_text(encoding="utf-8").split("\n"):
        if line.startswith("```"):
            in_code = not in_code
            continue
        candidates: list[str] = []
        if in_code:
            for rx in (SHOWN, PROMPT_LINE, PLAIN):
                m = rx.match(line.strip() if rx is PLAIN else line)
                if m:
                    candidates.append(m.group(1) or "")
                    break
        else:
            for m in CODE_SPAN.finditer(line):
                candidates.append(m.group(1).split(" ", 1)[1] if " " in m.group(1) else "")
        for text in candidates:
            words = _split(text)
            if "--" in words:
                words = words[:words.index("--")]
            name = resolve(words)
            if name:
                found.add(name)
    return found


def test_guide_shows_every_user_command():
    from bk.cli.manpage_admin import ADMIN_WORDS, DAEMON_WORDS
    shown = guide_commands(EN)
    wanted = {" ".join(c.path) for c in _tree()
              if c.path[0] not in ADMIN_WORDS + DAEMON_WORDS and len(c.path) == 1}
    missing = sorted(wanted - shown)
    assert not missing, f"docs/GUIDE.md never shows: {missing}"


def test_both_guides_show_the_same_commands():
    if not ZH.exists():
        pytest.skip("docs/GUIDE.zh-CN.md does not exist (yet)")
    en, zh = guide_commands(EN), guide_commands(ZH)
    assert len(en) > 40
    assert en == zh, (f"only in GUIDE.md: {sorted(en - zh)}; "
                      f"only in GUIDE.zh-CN.md: {sorted(zh - en)}")


def shown_command_lines(path: Path) -> list[tuple[int, str]]:
    """(line, words after bk) of every command a document shows in a code
    block: prompt lines anywhere, and plain `bk ...` lines in ```sh recipes
    (elsewhere such a line is the tool's own output)."""
    out: list[tuple[int, str]] = []
    lang = None
    for i, line in enumerate(path.read_text(encoding="utf-8").split("\n"), 1):
        if line.startswith("```"):
            lang = None if lang is not None else line[3:].strip()
            continue
        if lang is None:
            continue
        m = SHOWN.match(line) or (PLAIN.match(line.strip()) if lang == "sh" else None)
        if m:
            out.append((i, re.split(r" \| |; | && ", m.group(1) or "")[0]))
    return out


DOCS_WITH_COMMANDS = ("docs/GUIDE.md", "docs/GUIDE.zh-CN.md", "docs/CLUSTER.md", "docs/UPGRADING.md",
                      "docs/TELEMETRY.md", "docs/SECURITY.md", "docs/RELEASING.md", "README.md")


@pytest.mark.slow
@pytest.mark.parametrize("rel", DOCS_WITH_COMMANDS)
def test_every_command_shown_parses(rel):
    """Commands the tests cannot run (a shared server's root# sessions,
    recipes) still must be commands bk accepts, word for word."""
    import contextlib
    import io

    from bk.cli.app import parse_argv
    from bk.core.errors import BkError

    path = ROOT / rel
    if not path.exists():
        pytest.skip(f"{rel} does not exist (yet)")
    bad = []
    for line, text in shown_command_lines(path):
        if text.count("'") % 2 or text.count('"') % 2:
            continue                            # a JSON argument continued on the next line
        words = [w for w in _split(text) if w != "--json"]
        if "--" in words:
            words = words[:words.index("--") + 1] + ["true"]
        if not words:
            continue
        try:
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                parse_argv(words)
        except SystemExit as e:                 # --help
            if e.code not in (0, None):
                bad.append(f"{rel}:{line}: bk {text}")
        except BkError as e:
            bad.append(f"{rel}:{line}: bk {text}: {e}")
    assert not bad, "commands bk does not accept:\n" + "\n".join(bad)


def test_command_resolution():
    resolve = _resolver()
    assert resolve(["1", "30m"]) == "book"
    assert resolve(["x", "1", "2h"]) == "exclusive"
    assert resolve(["--json", "d", "99"]) == "cancel"
    assert resolve(["admin", "notice", "publish", "hi"]) == "admin notice publish"
    assert resolve(["@b", "l"]) == "@NODE"
    assert resolve(["c", "rec", "2", "1h"]) == "cluster rec"
    assert resolve(["nonsense"]) is None


def test_readme_links_every_document():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    listed = text[text.index("## Documentation"):]
    docs = [f"docs/{p.name}" for p in sorted((ROOT / "docs").glob("*.md"))]
    pages = [f"man/{p.name}" for p in sorted((ROOT / "man").iterdir())]
    missing = [d for d in docs + pages if f"]({d})" not in listed]
    assert not missing, f"README.md's Documentation list does not link: {missing}"


# ------------------------------------------------------------- man pages

def test_every_command_and_option_is_in_bk_1_or_bk_admin_8():
    pages = MAN["bk.1"] + MAN["bk-admin.8"]
    missing = []
    for c in _tree():
        for name in (" ".join(c.path), *c.aliases):
            if manpage.esc(name) not in pages:
                missing.append(f"command {name}")
        for o in c.options:
            for flag in o.flags:
                if f"\\fB{manpage.esc(flag)}\\fR" not in pages:
                    missing.append(f"{' '.join(c.path)} {flag}")
    assert not missing, f"in neither bk(1) nor bk-admin(8): {missing}"


def test_every_config_key_is_in_gpubk_config_5():
    missing = [k for k in KEYS if not re.search(rf"^\.B {re.escape(manpage.esc(k))}$", MAN["gpubk-config.5"], re.M)]
    assert not missing, f"config keys without an entry in gpubk-config(5): {missing}"


NOT_DOCUMENTED = {"PATH", "HOME"}       # what every program reads


def _variables_read() -> set[str]:
    """Every BK_* name in the code, and every variable it reads by name."""
    names: set[str] = set()
    for path in (ROOT / "bk").rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        names |= set(re.findall(r"""["'](BK_[A-Z_]+)["']""", text))
        names |= set(re.findall(r"""(?:env|environ)(?:\.get)?[(\[]\s*["']([A-Z][A-Z0-9_]+)["']""", text))
        names |= set(re.findall(r'xdg_dir\(env, "([A-Z_]+)"', text))
    return {n for n in names if not n.startswith("BK_TEST_") and n != "BK_VARS"} - NOT_DOCUMENTED


def test_every_environment_variable_is_in_a_man_page():
    env_sections = "".join(section for page in MAN.values()
                           for section in re.findall(r"^\.SH ENVIRONMENT\n(.*?)(?=^\.SH )", page, re.M | re.S))
    names = _variables_read()
    assert {"BK_DATA_DIR", "BK_NOW", "BK_GPU_COUNT", "XDG_STATE_HOME", "TZ", "NO_COLOR"} <= names
    missing = sorted(n for n in names if manpage.esc(n) not in env_sections)
    assert not missing, f"variables bk reads that no man page's ENVIRONMENT section names: {missing}"


# ------------------------------------------------------------ JSON fields

SIM = {"gpus": [
    {"name": "NVIDIA A100-SXM4-40GB", "mem_total_mib": 40960, "mem_used_mib": 20480, "util": 63,
     "temperature": 54, "processes": [{"pid": 4242, "mem_mib": 20000, "sm": 60, "uid": 1002,
                                       "user": "bob", "label": "python"}]},
    {"name": "NVIDIA A100-SXM4-40GB", "mem_total_mib": 40960, "mem_used_mib": 0, "util": 0,
     "temperature": 31, "processes": []}]}

# What a simulated private server can answer, one of each kind of output.
COMMANDS = [
    "1 1h -- /bin/true", "1 30m", "x 1 1h -t 12:00", "2 1h --dry-run", "l", "l --all", "l --history", "e 2 -d +30m",
    "st", "st -v", "tl", "t", "slots 2 1h", "g", "g 2", "n", "n --all", "history 1", "lg", "info",
    "login", "config", "doctor", "doctor --probe", "p save train 1 1h", "p", "p show train",
    "p train --dry-run", "p delete train", "d 2 -y", "u", "u users", "u samples --since 3h", "u events",
    "u verify", "m --once", "m status", "j", "w", "run", "agent context",
    "agent recommend '{\"count\": 1, \"duration\": 3600}'", "agent operation",
    "admin maintain --reason x -t 13:00 -d 1h --dry-run", "admin maintain list",
    "admin gpu-policy --disable 1 --dry-run", "admin services status", "admin login-hook status",
    "j log 1", "notify", "notify set --end-minutes 15,5 --dry-run", "notify test", "notify log",
    "1 7m", "d 99", "--version",
]
EXPECTED_ERRORS = ("1 7m", "d 99")              # for the error envelope's fields
# Maps whose keys are data, not field names: JSON Schema (documented as such),
# GPU indices, config keys (gpubk-config(5)), environment variable names.
SKIP_UNDER = {"input_schema", "output_schema", "reasons", "gpus", "settings", "env", "units"}


def _keys(value, out: set[str], parent: str = "") -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            if parent in SKIP_UNDER and (k.isdigit() or parent != "gpus"):
                continue
            if not k.isdigit():
                out.add(k)
            _keys(v, out, k)
    elif isinstance(value, list):
        for v in value:
            _keys(v, out, parent)


@pytest.fixture(scope="module")
def outputs(pyz, tmp_path_factory):
    d = tmp_path_factory.mktemp("jsonfields")
    (d / "sim.json").write_text(json.dumps(SIM))
    env = {"PATH": "/usr/bin:/bin", "HOME": str(d), "BK_DATA_DIR": str(d / "data"),
           "BK_GPU_SIM_FILE": str(d / "sim.json"), "BK_NOW": "2026-07-13T10:41:30Z", "TZ": "UTC",
           "LANG": "C.UTF-8"}
    _usage_history(d / "data")
    docs = {}
    for cmd in COMMANDS:
        p = subprocess.run([sys.executable, str(pyz), "--json", *shlex.split(cmd)], env=env,
                           capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
        assert p.stdout.strip(), f"bk --json {cmd}: no output; stderr: {p.stderr}"
        docs[cmd] = json.loads(p.stdout)
    return docs


def _usage_history(data_dir: Path) -> None:
    """Two hours of minute records written by the real Folder and UsageStore,
    so that every list of `bk u` has rows: a booking of ours used for the first
    hour and idle for the second, and another user's unreserved process."""
    from bk.core.models import GpuInfo, GpuProcess, Reservation
    from bk.core.telemetry import Snapshot
    from bk.core.usage import DAY, Folder
    from bk.store.usage import UsageStore

    now = 1_783_939_290                            # BK_NOW below
    today = now - now % DAY
    mine = Reservation("a" * 8 + "-0000-4000-8000-" + "0" * 12, os.getuid(), "me", "shared", (0,), 1,
                       today + 8 * 3600, today + 10 * 3600, today)
    folder, recs = Folder(60, 30), []
    for t in range(today + 8 * 3600, today + 10 * 3600, 30):
        procs = [GpuProcess(1, 100, 50, os.getuid())] if t < today + 9 * 3600 else []
        others = [GpuProcess(2, 200, 20, 60001)]
        gpus = (GpuInfo(0, "GPU-0", "sim", 1000, 100, 50, None, procs),
                GpuInfo(1, "GPU-1", "sim", 1000, 200, 20, None, others))
        recs += folder.add(t, Snapshot(t, "sim", gpus), None, [mine])
    os.makedirs(data_dir, mode=0o700, exist_ok=True)
    UsageStore(str(data_dir / "usage")).append(recs + folder.flush(), now=now)


def _documented() -> str:
    return "".join((ROOT / "docs" / n).read_text(encoding="utf-8") for n in ("JSON.md", "TELEMETRY.md"))


@pytest.mark.slow
def test_every_json_field_bk_prints_is_documented(outputs):
    doc = _documented()
    fields: dict[str, str] = {}
    for cmd, envelope in outputs.items():
        found: set[str] = set()
        _keys(envelope, found)
        for k in found:
            fields.setdefault(k, cmd)
    failed = sorted(cmd for cmd, e in outputs.items() if not e["ok"])
    assert failed == sorted(EXPECTED_ERRORS), f"these should answer with data: {failed}"
    assert {"schema", "reservation", "short_id", "mem_mib_effective", "monitor"} <= set(fields)
    missing = sorted(f"{k} (bk --json {cmd})" for k, cmd in fields.items() if f"`{k}`" not in doc)
    assert not missing, f"JSON fields in neither docs/JSON.md nor docs/TELEMETRY.md: {missing}"


def test_every_snapshot_and_heartbeat_field_is_in_telemetry_md():
    from bk.core.models import GpuInfo, GpuProcess
    from bk.core.telemetry import Attribution, Snapshot
    from bk.store.snapshot import heartbeat_doc, snapshot_doc

    proc = GpuProcess(pid=4242, mem_mib=100, sm=5, uid=1002, user="bob", label="python")
    snap = Snapshot(taken_at=1_783_939_290, source="sim-file", gpus=(
        GpuInfo(index=0, uuid="GPU-0", name="x", mem_total_mib=1, mem_used_mib=1, util=1,
                temperature=30, processes=(proc,)),), gaps=(), simulated=True)
    from bk.core.activity import Tracker
    from bk.core.models import Reservation
    from bk.store import activity as kept

    booked = Reservation("r1", 1002, "bob", "shared", (0,), 1, snap.taken_at - 60, snap.taken_at + 60, 0)
    tracker = Tracker(2.0)
    tracker.observe(snap.taken_at, snap, {(0, 4242): Attribution("ok", "verified", 1002)}, [booked])
    doc = snapshot_doc(snap, interval_s=2.0, inventory_fingerprint="f", pid=os.getpid(),
                       attributions={(0, 4242): Attribution("unreserved", "verified", 1002)},
                       activity=tracker.doc(snap, [booked]))
    stored = {"schema": kept.SCHEMA, "updated_at": 1, "updated_at_iso": "x", **tracker.to_store()}
    hb = heartbeat_doc(status="running", pid=1, started_at=1, updated_at=2, interval_s=2.0,
                       detail=None, samples=1)
    text = (ROOT / "docs" / "TELEMETRY.md").read_text(encoding="utf-8")
    found: set[str] = set()
    _keys(doc, found)
    _keys(hb, found)
    _keys({k: v for k, v in stored.items() if k not in ("bookings", "baselines")}, found)
    _keys(stored["bookings"]["r1"], found)
    assert {"taken_at", "fingerprint", "attribution", "container", "samples", "activity", "evidence",
            "power_mw", "last_t"} <= found
    missing = sorted(k for k in found if f"`{k}`" not in text)
    assert not missing, f"snapshot/heartbeat fields missing from docs/TELEMETRY.md: {missing}"


def test_every_attack_security_md_names_is_a_test_that_exists():
    """docs/SECURITY.md's boundary table names the test that attacks each
    boundary (issue 22 item 9): a renamed or deleted test must not leave the
    table pointing at nothing."""
    text = (ROOT / "docs" / "SECURITY.md").read_text()
    section = text.split("## Boundaries and the tests that attack them", 1)[1].split("\n## ", 1)[0]
    rows = [ln for ln in section.splitlines() if ln.startswith("| ") and not ln.startswith("| ---")][1:]
    assert len(rows) >= 15, "the boundary table lost its rows"
    missing = []
    for row in rows:
        attacked = row.rsplit("|", 2)[-2]
        names = re.findall(r"(tests/test_\w+\.py)(?:::(test_\w+))?|::(test_\w+)", attacked)
        assert names, f"a boundary with no test: {row}"
        current = None
        for path, name, bare in names:
            if path:
                current = ROOT / path
                if not current.exists():
                    missing.append(path)
                    continue
            name = name or bare
            if name and (current is None or f"def {name}(" not in current.read_text()):
                missing.append(f"{current}::{name}")
    assert not missing, missing
