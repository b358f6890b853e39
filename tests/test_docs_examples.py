"""Every shell example in docs/GUIDE.md and docs/GUIDE.zh-CN.md is run here,
through the built bk.pyz, so neither guide can drift from the tool.

THE CONVENTION (both guides follow it; a guide written to it needs no test change)

Sessions.  A fenced code block (```, ```console or ```text) whose first
non-blank line starts with a prompt is a session.  Prompts:

    $ CMD        the reader (called ada) on a simulated private server: RUN here
    ada$ CMD     ada on a shared server        } need root, a service account
    bob$ CMD     bob on a shared server        } and a broker: not run here,
    gpubk$ CMD   the service account           } the test prints the block as
    root# CMD    root                          } skipped, with the reason

A block with any prompt other than `$ ` is a shared-server block and is
skipped as a whole (reported, with its line number).  Lines after a command,
up to the next prompt line, are its expected output: stdout and stderr as one
stream, in the order the tool wrote them.  A last output line `[exit N]` is
the expected exit status (without it, 0).  A command ending in a backslash
continues on the next line.  Blocks without prompts (the prompt's own `bk>`
transcripts) and blocks of any other language (```sh recipes, ```json files)
are not run; tests/test_docs_coverage.py still checks that every command they
show parses.

Comparison is exact, line by line, after this normalisation only:
  - trailing spaces and trailing blank lines are ignored;
  - booking IDs: each 8-hex-digit word (or full UUID, compared by its first
    eight digits) in the expected output stands for the
    ID the tool printed in that place, consistently through the whole
    scenario (the guide's 42430cd2 is "the first booking", whatever its real
    ID); a later command that names a guide ID or a 4+-digit prefix of one is
    run with the real ID's prefix of the same length;
  - the scenario directory (a fresh temporary directory; BK_DATA_DIR is its
    `data`) is printed as /tmp/g/ada, so `bk info` shows data /tmp/g/ada/data;
  - an output line that is exactly `...` stands for any number of lines (use
    it for long outputs shortened in the guide).

Scenarios.  Each `## ` section starts a fresh simulated server; the sessions
in it run in order and see each other's bookings.  The server is:
  BK_DATA_DIR=<scenario>/data  BK_GPU_COUNT=4  BK_NOW=2026-07-13T10:41:30Z
  TZ=UTC  COLUMNS=80  NO_COLOR=1  LANG=C.UTF-8  HOME=<scenario>/home
  cwd=<scenario>, `bk` on PATH (the built archive), run as the user ada
  (created for the test when running as root; otherwise the current user,
  whose name is then printed as ada and runs of spaces compare as one).
  ada's UID is never one that a guide's `file` block gives a simulated
  process ("uid": 1002, bob): bk does not count the asking user's own
  processes against a GPU, so the output would depend on which UID useradd
  happened to hand out on this machine.
Variables a command sets (`export`, `unset`, `id=$(bk 1 30m -q)`) and `cd`
carry to the following commands of the scenario, as in one shell.  A command
still running after 60 s is stopped with everything it started and fails the
test (mark a daemon's block skip).

Directives: HTML comments on their own line(s) before a block, which a
Markdown reader does not show:
  <!-- example: fresh -->            a fresh simulated server from this block on
  <!-- example: env K=V K2=V2 -->    set environment variables from this block
                                     on (e.g. BK_NOW=2026-07-13T12:00:00Z;
                                     {dir} in V is the scenario directory)
  <!-- example: file NAME -->        the next block is not run: it is written
                                     to NAME in the scenario directory (e.g. the
                                     guide's sim.json, then `$ export
                                     BK_GPU_SIM_FILE=$PWD/sim.json`)
  <!-- example: use NAME -->         write the guide's earlier `file NAME` block
                                     to NAME again (a later section's fresh server)
  <!-- example: skip REASON -->      the next block is not run; REASON printed
  <!-- example: root -->             the next block needs root and a shared
                                     server (implied by its prompts)
  <!-- example: setup CMD -->        run CMD here, unshown, before the next
                                     block (its output is not compared, a
                                     non-zero exit fails): what a skipped block
                                     (a dialog at a terminal) did, so the
                                     sessions after it see the same schedule

A missing guide (docs/GUIDE.zh-CN.md while it is being written) is skipped
with that reason.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
GUIDES = ("docs/GUIDE.md", "docs/GUIDE.zh-CN.md")
READER = "ada"
SHOWN_DIR = "/tmp/g/ada"
NOW = "2026-07-13T10:41:30Z"
PROMPT = re.compile(r"^(\$|ada\$|bob\$|gpubk\$|root#) (.*)$")
DIRECTIVE = re.compile(r"^<!--\s*example:\s*(\w[\w-]*)\s*(.*?)\s*-->\s*$")
EXIT = re.compile(r"^\[exit (\d+)\]$")
HEX8 = re.compile(r"\b[0-9a-f]{8}(?:-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})?\b")
HEXWORD = re.compile(r"(?<![\w./-])[0-9a-f]{4,8}(?![\w./-])")


# ------------------------------------------------------------------ parsing

@dataclass
class Command:
    text: str
    expected: list[str]
    status: int


@dataclass
class Block:
    guide: str
    line: int                       # 1-based line of the opening fence
    kind: str                       # run / file / skip / root / plain
    body: list[str]
    commands: list[Command] = field(default_factory=list)
    reason: str = ""
    fresh: bool = False
    env: dict[str, str] = field(default_factory=dict)
    name: str = ""                  # file directive: where to write the body
    setup: list[str] = field(default_factory=list)
    uses: list[str] = field(default_factory=list)
    section: str = ""


def parse(guide: str, text: str) -> list[Block]:
    """The guide's fenced blocks, each with the directives before it."""
    lines = text.split("\n")
    blocks: list[Block] = []
    pending: list[tuple[str, str]] = []
    section = ""
    i = 0
    while i < len(lines):
        ln = lines[i]
        if ln.startswith("## "):
            section = ln[3:].strip()
            pending.append(("fresh", ""))
        m = DIRECTIVE.match(ln.strip())
        if m:
            pending.append((m.group(1), m.group(2)))
        if ln.startswith("```"):
            lang = ln[3:].strip()
            j = i + 1
            while j < len(lines) and not lines[j].startswith("```"):
                j += 1
            b = Block(guide, i + 1, "plain", lines[i + 1:j], section=section)
            _classify(b, lang, pending)
            pending = []
            blocks.append(b)
            i = j + 1
            continue
        i += 1
    return blocks


def _classify(b: Block, lang: str, directives: list[tuple[str, str]]) -> None:
    for word, arg in directives:
        if word == "fresh":
            b.fresh = True
        elif word == "env":
            for pair in arg.split():
                k, _, v = pair.partition("=")
                b.env[k] = v
        elif word == "file":
            b.kind, b.name = "file", arg
        elif word == "skip":
            b.kind, b.reason = "skip", arg or "marked skip"
        elif word == "use":
            b.uses.append(arg)
        elif word == "setup":
            b.setup.append(arg)
        elif word == "root":
            b.kind, b.reason = "root", "needs root and a shared server"
        else:
            raise AssertionError(f"{b.guide}:{b.line}: unknown example directive {word!r}")
    if b.kind == "file":
        return
    first = next((ln for ln in b.body if ln.strip()), "")
    if lang not in ("", "console", "text") or not PROMPT.match(first):
        if b.kind == "plain":
            return
    prompts = {PROMPT.match(ln).group(1) for ln in b.body if PROMPT.match(ln)}
    if b.kind in ("skip", "root"):
        return
    if prompts - {"$"}:
        b.kind = "root"
        b.reason = f"shared-server session ({', '.join(sorted(prompts - {'$'}))} prompts): " \
                   "needs root, a service account and a broker"
        return
    b.kind = "run"
    b.commands = _commands(b.body)


def _commands(body: list[str]) -> list[Command]:
    out: list[Command] = []
    i = 0
    while i < len(body):
        m = PROMPT.match(body[i])
        if not m:
            i += 1
            continue
        text = m.group(2)
        while text.endswith("\\") and i + 1 < len(body):
            i += 1
            text = text[:-1] + "\n" + body[i]
        i += 1
        expected: list[str] = []
        while i < len(body) and not PROMPT.match(body[i]):
            expected.append(body[i].rstrip())
            i += 1
        while expected and not expected[-1]:
            expected.pop()
        status = 0
        if expected and EXIT.match(expected[-1]):
            status = int(EXIT.match(expected[-1]).group(1))
            expected.pop()
        out.append(Command(text, expected, status))
    return out


# ---------------------------------------------------------------- matching

def match(expected: list[str], actual: list[str], ids: dict[str, str], loose: bool) -> bool:
    """Whether actual fits expected (`...` lines are wildcards); on success
    ``ids`` gains the guide-ID -> real-ID pairs the match implied."""
    def line_ok(e: str, a: str, m: dict[str, str]) -> dict[str, str] | None:
        if loose:
            e, a = re.sub(r" {2,}", " ", e), re.sub(r" {2,}", " ", a)
        parts = HEX8.split(e)
        keys = HEX8.findall(e)
        rx = "([0-9a-f]{8})(?:-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})?".join(
            re.escape(p) for p in parts)
        keys = [k[:8] for k in keys]
        got = re.fullmatch(rx, a)
        if not got:
            return None
        m = dict(m)
        seen = set(m.values())
        for k, v in zip(keys, got.groups(), strict=True):
            if k in m:
                if m[k] != v:
                    return None
            elif k == v or v not in seen:    # a fixed hex word, or a new ID
                m[k] = v
                seen.add(v)
            else:
                return None
        return m

    def go(i: int, j: int, m: dict[str, str]) -> dict[str, str] | None:
        if i == len(expected):
            return m if j == len(actual) else None
        if expected[i] == "...":
            for k in range(j, len(actual) + 1):
                r = go(i + 1, k, m)
                if r is not None:
                    return r
            return None
        if j == len(actual):
            return None
        m2 = line_ok(expected[i], actual[j], m)
        return None if m2 is None else go(i + 1, j + 1, m2)

    r = go(0, 0, ids)
    if r is None:
        return False
    ids.update(r)
    return True


def substitute(cmd: str, ids: dict[str, str]) -> str:
    """The command with guide IDs (and their prefixes) replaced by real ones."""
    def rep(m: re.Match) -> str:
        w = m.group(0)
        for doc, real in ids.items():
            if doc.startswith(w) and doc != real:
                return real[:len(w)]
        return w
    return HEXWORD.sub(rep, cmd)


# ----------------------------------------------------------------- running

def guide_blocks(rel: str) -> list[Block]:
    path = ROOT / rel
    if not path.exists():
        return []
    return parse(rel, path.read_text(encoding="utf-8"))


def scenarios(blocks: list[Block]) -> list[list[Block]]:
    out: list[list[Block]] = []
    for b in blocks:
        if b.fresh or not out:
            out.append([])
        out[-1].append(b)
    return [s for s in out if any(b.kind == "run" for b in s)]


def simulated_uids() -> set[int]:
    """The UIDs the guides' `file` blocks give simulated processes."""
    return {int(u) for rel in GUIDES for b in guide_blocks(rel) if b.kind == "file"
            for u in re.findall(r'"uid"\s*:\s*(\d+)', "\n".join(b.body))}


def free_uid(avoid: set[int], first: int = 1000, last: int = 59999) -> int:
    """The lowest UID from ``first`` that no account has and ``avoid`` lacks."""
    for uid in range(first, last + 1):
        if uid in avoid:
            continue
        try:
            pwd.getpwuid(uid)
        except KeyError:
            return uid
    raise AssertionError(f"no free UID in {first}..{last}")


class Reader:
    """The user the `$ ` sessions run as: ada, made for the test when root.

    Two runs of this file may overlap (a full suite and a single test), and
    one must not delete ada under the other.  Every run holds a shared flock
    on LOCK while it uses ada; ada is made, and removed, only under the
    exclusive lock, and removed only when this file made it (MARKER) and no
    other run holds the lock.  flock(2) locks are dropped by the kernel when
    a run dies, so a crashed run blocks nobody."""

    LOCK, MARKER = "/tmp/bkdoc-ada.lock", "/tmp/bkdoc-ada.made"

    def __init__(self) -> None:
        self.fd = None
        if os.getuid() == 0:
            import fcntl

            self.fd = os.open(self.LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            fcntl.flock(self.fd, fcntl.LOCK_EX)
            try:
                self._make_ada(simulated_uids())
            except BaseException:
                os.close(self.fd)
                raise
            fcntl.flock(self.fd, fcntl.LOCK_SH)
            pw = pwd.getpwnam(READER)
            self.uid, self.gid, self.loose = pw.pw_uid, pw.pw_gid, False
            self.python = "/usr/bin/python3"
        else:
            self.uid, self.gid = os.getuid(), os.getgid()
            self.loose = pwd.getpwuid(self.uid).pw_name != READER
            self.python = shutil.which("python3") or "/usr/bin/python3"
            if self.uid in simulated_uids():
                pytest.skip(f"your UID {self.uid} is a simulated process owner's in the guides' examples")
        self.name = pwd.getpwuid(self.uid).pw_name

    def _make_ada(self, avoid: set[int]) -> None:
        """ada, with a UID outside ``avoid``; under the exclusive lock."""
        try:
            pw = pwd.getpwnam(READER)
        except KeyError:
            pass
        else:
            if pw.pw_uid not in avoid:
                return
            if not os.path.exists(self.MARKER):
                pytest.skip(f"the account {READER} exists with UID {pw.pw_uid}, a simulated process "
                            "owner's in the guides' examples")
            subprocess.run(["userdel", READER], check=True, capture_output=True)   # an older run's
        for _ in range(20):
            # Another test may take the same free UID between the look-up and
            # useradd, which then refuses (exit 4): look again.
            p = subprocess.run(["useradd", "-M", "-d", "/nonexistent", "-s", "/usr/sbin/nologin",
                                "-u", str(free_uid(avoid)), READER], capture_output=True, text=True)
            if p.returncode == 0:
                Path(self.MARKER).write_text(READER)
                return
            if p.returncode != 4:
                raise AssertionError(f"useradd {READER}: {p.stderr}")
        raise AssertionError(f"useradd {READER}: no free UID after 20 tries")

    def cleanup(self) -> None:
        if self.fd is None:
            return
        import fcntl

        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pass                                # another run still uses ada; it removes it
        else:
            if os.path.exists(self.MARKER):
                # userdel refuses while a process of ada exists, and a process
                # group killed with SIGKILL is reaped a moment later.
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline:
                    if subprocess.run(["userdel", READER], capture_output=True).returncode == 0:
                        break
                    time.sleep(0.05)            # poll with a deadline: ada's last process exiting
                os.unlink(self.MARKER)
        os.close(self.fd)


@pytest.fixture(scope="module")
def reader():
    r = Reader()
    yield r
    r.cleanup()


@pytest.fixture(scope="module")
def bindir(pyz, reader):
    """A world-readable directory holding the archive and a `bk` command."""
    d = Path(tempfile.mkdtemp(prefix="bkdoc_bin_"))
    os.chmod(d, 0o755)
    shutil.copy(pyz, d / "bk.pyz")
    os.chmod(d / "bk.pyz", 0o644)
    (d / "bk").write_text(f'#!/bin/sh\nexec {reader.python} {d}/bk.pyz "$@"\n')
    os.chmod(d / "bk", 0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


class Scenario:
    def __init__(self, reader: Reader, bindir: Path):
        self.reader = reader
        self.dir = Path(tempfile.mkdtemp(prefix="bkdoc_"))
        os.chmod(self.dir, 0o755)
        (self.dir / "home").mkdir()
        if os.getuid() == 0:
            os.chown(self.dir, reader.uid, reader.gid)
            os.chown(self.dir / "home", reader.uid, reader.gid)
        self.cwd = str(self.dir)
        self.ids: dict[str, str] = {}
        self.env = {
            "PATH": f"{bindir}:/usr/bin:/bin", "HOME": str(self.dir / "home"),
            "USER": reader.name, "LOGNAME": reader.name, "BK_DATA_DIR": str(self.dir / "data"),
            "BK_GPU_COUNT": "4", "BK_NOW": NOW, "TZ": "UTC", "COLUMNS": "80", "LINES": "24",
            "NO_COLOR": "1", "LANG": "C.UTF-8", "TERM": "dumb", "TMPDIR": str(self.dir),
        }

    def run(self, cmd: Command) -> tuple[int, list[str]]:
        state = self.dir / ".state"
        # set -a exports every variable the command sets (id=$(bk ... -q)),
        # so that env -0 carries it to the next command as a shell would.
        script = (f"set -a\ncd {shellquote(self.cwd)} || exit 99\n{substitute(cmd.text, self.ids)}\n"
                  f"__rc=$?\nenv -0 > {state}.env\npwd > {state}.cwd\nexit $__rc\n")
        kw = {}
        if os.getuid() == 0:
            kw = {"user": self.reader.uid, "group": self.reader.gid, "extra_groups": []}
        # Its own session, so that a command that does not end (a daemon the
        # guide should have marked) is stopped with everything it started.
        p = subprocess.Popen(["/bin/bash", "--noprofile", "--norc", "-c", script], env=self.env,
                             stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, start_new_session=True, **kw)
        try:
            raw_out, _ = p.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            raw_out, _ = p.communicate()
            return -1, ["(still running after 60 s: stopped; mark a daemon's block skip)"]
        finally:
            try:
                os.killpg(p.pid, signal.SIGKILL)    # what it left running in the background
            except ProcessLookupError:
                pass
        if (state.parent / (state.name + ".env")).exists():
            raw = (state.parent / (state.name + ".env")).read_bytes().decode()
            self.env = dict(kv.split("=", 1) for kv in raw.split("\0") if "=" in kv)
            for k in ("_", "SHLVL", "PWD", "OLDPWD", "__rc"):
                self.env.pop(k, None)
            self.cwd = (state.parent / (state.name + ".cwd")).read_text().strip()
        out = raw_out.decode("utf-8", "replace").replace(str(self.dir), SHOWN_DIR)
        if self.reader.loose:
            out = re.sub(rf"\b{re.escape(self.reader.name)}\b", READER, out)
        lines = [ln.rstrip() for ln in out.split("\n")]
        while lines and not lines[-1]:
            lines.pop()
        return p.returncode, lines

    def cleanup(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


def shellquote(s: str) -> str:
    return "'" + s.replace("'", "'\\''") + "'"


def _cases():
    for rel in GUIDES:
        found = guide_blocks(rel)
        if not found:
            yield pytest.param(rel, None, {}, id=f"{rel}-missing",
                               marks=pytest.mark.skip(reason=f"{rel} does not exist (yet)"))
            continue
        files = {b.name: b.body for b in found if b.kind == "file"}
        for n, sc in enumerate(scenarios(found), 1):
            yield pytest.param(rel, sc, files, id=f"{Path(rel).name}-{n}-line{sc[0].line}")


def write_file(sc: Scenario, reader: Reader, name: str, body: list[str]) -> None:
    target = Path(sc.cwd) / name
    target.write_text("\n".join(body) + "\n", encoding="utf-8")
    if os.getuid() == 0:
        os.chown(target, reader.uid, reader.gid)


@pytest.mark.slow
@pytest.mark.parametrize(("rel", "scenario", "files"), list(_cases()))
def test_guide_examples(rel, scenario, files, reader, bindir, capsys):
    sc = Scenario(reader, bindir)
    failures: list[str] = []
    try:
        for b in scenario:
            for k, v in b.env.items():
                sc.env[k] = v.replace("{dir}", str(sc.dir))
            for name in b.uses:
                assert name in files, f"{rel}:{b.line}: no earlier `file {name}` block"
                write_file(sc, reader, name, files[name])
            for cmd in b.setup:
                rc, lines = sc.run(Command(cmd, [], 0))
                if rc != 0:
                    failures.append(f"{rel}:{b.line}: setup {cmd!r} exited {rc}:\n" + "\n".join(lines))
            if b.kind == "file":
                write_file(sc, reader, b.name, b.body)
            elif b.kind in ("skip", "root"):
                with capsys.disabled():
                    print(f"\n  skipped {rel}:{b.line}: {b.reason}", end="")
            elif b.kind == "run":
                for c in b.commands:
                    rc, lines = sc.run(c)
                    ok = rc == c.status and match(c.expected, lines, sc.ids, reader.loose)
                    if not ok:
                        failures.append(
                            f"{rel}:{b.line} ({b.section}): $ {c.text}\n"
                            f"--- the guide says (exit {c.status}):\n" + "\n".join(c.expected) +
                            f"\n--- bk printed (exit {rc}):\n" + "\n".join(lines))
    finally:
        sc.cleanup()
    assert not failures, "\n\n".join(failures)


# ------------------------------------------------ the extractor's own tests

def test_parser_reads_commands_output_status_and_directives():
    text = "\n".join([
        "## 9. Demo", "<!-- example: env BK_GPU_COUNT=2 -->", "```", "$ bk 1 30m",
        "booked 1 GPU (0) shared 07-13 10:40–11:10 [42430cd2]", "$ bk d 9", "error: no", "[exit 4]",
        "```", "<!-- example: file sim.json -->", "```json", "{}", "```",
        "```", "bob$ bk l", "```", "```sh", "$ not a session", "```",
    ])
    run, file_, shared, plain = parse("X.md", text)
    assert run.kind == "run" and run.fresh and run.env == {"BK_GPU_COUNT": "2"}
    assert [(c.text, c.status) for c in run.commands] == [("bk 1 30m", 0), ("bk d 9", 4)]
    assert run.commands[1].expected == ["error: no"]
    assert file_.kind == "file" and file_.name == "sim.json" and file_.body == ["{}"]
    assert shared.kind == "root" and "bob$" in shared.reason
    assert plain.kind == "plain"


def test_ids_map_consistently_and_prefixes_are_substituted():
    ids: dict[str, str] = {}
    assert match(["booked [42430cd2]"], ["booked [deadbeef]"], ids, False)
    assert ids == {"42430cd2": "deadbeef"}
    assert not match(["again [42430cd2]"], ["again [0badf00d]"], ids, False)
    assert not match(["other [87450527]"], ["other [deadbeef]"], ids, False)
    assert substitute("bk d 4243 && bk e 42430cd2 -d +1h", ids) == "bk d dead && bk e deadbeef -d +1h"
    assert match(["a", "...", "z"], ["a", "b", "c", "z"], ids, False)
    assert not match(["a", "z"], ["a", "b", "z"], ids, False)


def test_the_reader_owns_no_simulated_process(reader):
    # A guide's bob (uid 1002) must stay someone else: were ada 1002, bk would
    # not count bob's process against GPU 0 and the guide's output would change.
    sims = simulated_uids()
    assert 1002 in sims
    assert reader.uid not in sims
    first = free_uid(set())
    assert free_uid({first}) > first
    assert free_uid(sims | {first}) not in sims | {first}
