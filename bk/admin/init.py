"""``sudo bk admin init``: the smallest set-up of a shared server.

What it does.  It writes the trusted configuration (default
``/etc/gpubk/config.json``, root:root 0644) and creates the data directory
and the socket directory owned by the service account.  That is all the
broker needs; the installer (``bk admin install``, a later issue) adds the
archive, the systemd units and the rest on top of it.

What it never does.  It creates no accounts and no groups (the administrator
owns those decisions), never replaces a configuration that says something
different, and never takes over a non-empty directory that belongs to
someone else.  Running it again with the same options changes nothing.

Order matters.  The config file is written last: its mere existence switches
every ``bk`` on the machine to shared mode, so it must not appear before the
directories it names.  It is written to a temporary file in its directory,
checked with the same trust rule every client applies (``check_trusted``:
root-owned, nobody else can write it or any directory above it), and then
linked into place with ``link(2)``, which fails rather than overwrite a
config that appeared in the meantime.

Modes.  ``access: all``: data and socket directories 0755, the socket 0666.
``access: group``: the data directory 0750 and the socket directory 2750,
both with that group, so only members can read the ledger or reach the
socket.  The set-group-ID bit on the socket directory makes the socket the
broker binds there inherit the group, which the unprivileged broker could
not otherwise give it.
"""

from __future__ import annotations

import json
import os
import stat

from bk.core.errors import ConfigError, InvalidInput, PermissionDenied
from bk.core.record import dataclass, field, replace
from bk.store.fsutil import Safety, fsync_dir_at, open_dir, replace_file, unsafe_ancestor
from bk.store.paths import DEFAULT_SHARED_DATA_DIR, DEFAULT_SOCKET, SYSTEM_CONFIG

SUN_PATH_MAX = 107


@dataclass(frozen=True)
class Options:
    service_user: str | None = None
    data_dir: str = DEFAULT_SHARED_DATA_DIR
    socket: str = DEFAULT_SOCKET
    access: str = "all"
    group: str | None = None
    gpu_count: int | None = None
    slot_minutes: int | None = None
    max_shared_users: int | None = None
    config_file: str = SYSTEM_CONFIG
    simulated_gpus: bool = False       # a trial server: gpu_count GPUs simulated on purpose
    admin_contact: str | None = None


@dataclass(frozen=True)
class Step:
    """One change to the system, or a note that something is already right."""

    action: str          # mkdir | adopt | chmod | write | keep
    path: str
    uid: int
    gid: int
    mode: int
    why: str = ""

    def to_json(self) -> dict:
        return {"action": self.action, "path": self.path, "uid": self.uid, "gid": self.gid,
                "mode": f"{self.mode:04o}", "why": self.why}


@dataclass
class Plan:
    options: Options
    service_user: str
    service_uid: int
    service_gid: int
    group_gid: int | None
    config: dict                      # what init writes (or found identical)
    steps: list[Step] = field(default_factory=list)
    kept: dict | None = None          # the policy bound in a ledger already in the data directory

    @property
    def changes(self) -> list[Step]:
        return [s for s in self.steps if s.action != "keep"]


@dataclass
class Result:
    plan: Plan
    status: str                       # created | unchanged | dry_run
    applied: list[Step]

    def to_json(self) -> dict:
        p = self.plan
        return {"status": self.status, "dry_run": self.status == "dry_run",
                "config_file": p.options.config_file, "config": p.config,
                "service_user": p.service_user, "service_uid": p.service_uid,
                "data_dir": p.options.data_dir, "socket": p.options.socket,
                "steps": [s.to_json() for s in p.steps],
                "changed": [s.path for s in self.applied]}


# ------------------------------------------------------------- planning

def _service_account(options: Options, env: dict):
    import pwd

    name = options.service_user or env.get("SUDO_USER")
    if not name or name == "root":
        raise InvalidInput("name the service account that will run the broker and own the data",
                           hint="sudo bk admin init --service-user gpubk (create it first: "
                                "sudo useradd --system --no-create-home --shell /usr/sbin/nologin gpubk)")
    try:
        pw = pwd.getpwnam(name)
    except KeyError:
        raise InvalidInput(f"there is no account named {name!r}; bk admin init creates no accounts",
                           hint="create it first: sudo useradd --system --no-create-home --shell "
                                f"/usr/sbin/nologin {name}") from None
    if pw.pw_uid == 0:
        raise InvalidInput(f"the service account {name!r} is root; the broker must run unprivileged",
                           hint="use a dedicated account, e.g. --service-user gpubk")
    return pw


def _group(options: Options) -> int | None:
    import grp

    if options.access == "all":
        if options.group:
            raise InvalidInput("--group needs --access group", hint="add --access group")
        return None
    if options.access != "group":
        raise InvalidInput(f"--access must be all or group, got {options.access!r}")
    if not options.group:
        raise InvalidInput("--access group needs --group NAME", hint="e.g. --access group --group gpu-users")
    try:
        return grp.getgrnam(options.group).gr_gid
    except KeyError:
        raise InvalidInput(f"there is no group named {options.group!r}; bk admin init creates no groups",
                           hint=f"create it first: sudo groupadd {options.group}") from None


def config_document(options: Options, uid: int, gid: int, kept: dict | None = None) -> dict:
    """The config init writes; ``kept``: the bound settings of a kept ledger
    that no option names (``_keep_binding``)."""
    from bk.store.config import parse_document

    doc: dict = {"data_dir": options.data_dir, "socket": options.socket, "service_uid": uid,
                 "service_gid": gid, "access": options.access}
    if options.group:
        doc["group"] = options.group
    for key in ("gpu_count", "slot_minutes", "max_shared_users", "admin_contact"):
        value = getattr(options, key)
        if value is not None:
            doc[key] = value
    if options.simulated_gpus:
        doc["simulated_gpus"] = True
    doc.update(kept or {})
    try:
        return parse_document(doc, "bk admin init", allow_security=True)
    except ConfigError as e:
        raise InvalidInput(e.message.replace("bk admin init: ", ""), hint="see man 5 gpubk-config") from None


def gpu_backend_reason(env: dict) -> str | None:
    """Why no GPU backend here can count the GPUs (then ``--gpu-count`` is
    required), or None when one can."""
    from bk.admin import rootenv
    from bk.gpu import open_backend

    # nvidia-smi is looked up on root's own PATH, never the caller's.
    return open_backend(dict(env, PATH=rootenv.trusted_path()), None).reason


def gpus_detectable(env: dict) -> bool:
    """Whether a GPU backend here can count the GPUs (else ``--gpu-count`` is required)."""
    return not gpu_backend_reason(env)


# The options that set a bound setting, by the flag that gives them.
BOUND_OPTIONS = {"gpu_count": "--gpu-count", "slot_minutes": "--slot-minutes",
                 "max_shared_users": "--max-shared-users"}


def kept_binding(data_dir: str) -> dict | None:
    """The policy bound in a ledger already in ``data_dir`` (the data an
    uninstall kept, or a directory made ready by hand), or None: no
    ledger, nothing bound yet, or a ledger that cannot be read (the broker
    then says why, as for any damaged ledger)."""
    from bk.core.errors import BkError
    from bk.store.ledger import Store

    try:
        st = os.lstat(data_dir)
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode):
        return None
    try:
        got = Store(data_dir, private=False, owner_uid=st.st_uid).read()
    except (BkError, OSError):
        return None
    policy = got.state.policy if got.source != "empty" else None
    return dict(policy) if isinstance(policy, dict) else None


def _keep_binding(options: Options, bound: dict) -> tuple[Options, dict]:
    """The options with the kept ledger's bound settings where none was
    given, and the other bound keys the config must carry; an option that
    disagrees with the ledger is refused, naming both (a config that says
    otherwise would keep the broker from starting: every write would be
    refused)."""
    from bk.core.models import Policy
    from bk.core.policy import same

    where = os.path.join(options.data_dir, "ledger.json")
    differ = [f"{flag} {getattr(options, key)} (ledger: {bound[key]})" for key, flag in BOUND_OPTIONS.items()
              if getattr(options, key) is not None and key in bound and not same(getattr(options, key), bound[key])]
    if differ:
        raise InvalidInput(f"the data directory keeps a ledger ({where}) whose first booking bound other "
                           "settings: " + "; ".join(differ) + "; nothing was changed",
                           hint="leave them out to keep the ledger's, or move the data directory away to start "
                                "a new ledger")
    options = replace(options, **{k: bound[k] for k in BOUND_OPTIONS if getattr(options, k) is None and k in bound})
    default = Policy(gpu_count=1)
    extra = {k: bound[k] for k in Policy.BOUND_KEYS
             if k not in BOUND_OPTIONS and k in bound and not same(bound[k], getattr(default, k))}
    return options, extra


def _absolute(path: str, flag: str) -> str:
    if not os.path.isabs(path):
        raise InvalidInput(f"{flag} must be an absolute path, got {path!r}")
    return os.path.normpath(path)


def _check_ancestors(path: str, owners: tuple[int, ...]) -> list[str]:
    """Existing directories above ``path`` must be safe (the rule of
    ``check_trusted``); returns the missing ones, top first, to create."""
    missing = []
    d = os.path.dirname(path)
    while not os.path.lexists(d):
        missing.append(d)
        d = os.path.dirname(d)
    bad = unsafe_ancestor(d, owners)
    if bad is None:
        return list(reversed(missing))
    where, st, why = bad
    if why in ("unreadable", "not a directory"):
        raise ConfigError(f"{where} (above {path}) is not a plain directory",
                          hint="choose a path below real, root-owned directories")
    raise ConfigError(f"{path} would lie below {where}, which others can change "
                      f"(owner uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o})",
                      hint="choose a path below root-owned directories that only root can write")


def _dir_steps(path: str, uid: int, gid: int, mode: int, why: str) -> list[Step]:
    steps = [Step("mkdir", d, 0, 0, 0o755, "parent directory")
             for d in _check_ancestors(path, (0, uid))]
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return steps + [Step("mkdir", path, uid, gid, mode, why)]
    if not stat.S_ISDIR(st.st_mode):
        raise ConfigError(f"{path} exists and is not a directory (it is a link or a file)",
                          hint="move it away or choose another path")
    if st.st_uid != uid:
        if os.listdir(path):
            raise ConfigError(f"{path} already holds files and belongs to uid {st.st_uid}, not to the "
                              "service account; refusing to take it over",
                              hint="choose another directory, or move those files away first")
        return steps + [Step("adopt", path, uid, gid, mode, why + " (existing, empty)")]
    if (st.st_gid, stat.S_IMODE(st.st_mode)) != (gid, mode):
        return steps + [Step("chmod", path, uid, gid, mode, why + " (existing; owner and mode set)")]
    return steps + [Step("keep", path, uid, gid, mode, why)]


def read_trusted(path: str, hint: str):
    """The JSON value in the existing trusted config ``path``, which is
    checked first as every client checks it; ``hint`` for a file that is
    not JSON."""
    from bk.store.config import check_trusted

    check_trusted(path)
    try:
        with open(path, "rb") as f:
            return json.loads(f.read(1 << 20))
    except (OSError, ValueError) as e:
        raise ConfigError(f"{path} exists but cannot be read as JSON: {e}", hint=hint) from None


def _existing_config(path: str, doc: dict, may_change: tuple[str, ...] = ()) -> tuple[Step, dict] | None:
    """None when no config exists; a 'keep' step when it already says what
    init would write; a 'rewrite' step (with the document it writes: the
    existing one, those keys changed) when only keys in ``may_change``
    differ; otherwise a refusal."""
    if not os.path.lexists(path):
        return None
    old = read_trusted(path, "fix or move it away, then rerun")
    if not isinstance(old, dict):
        raise ConfigError(f"{path} exists but is not a JSON object", hint="fix or move it away, then rerun")
    # A key init would not write (``group`` after a switch back to all)
    # differs too when it is one of those that may change.
    keys = sorted(set(doc) | {k for k in may_change if k in old})
    differ = [k for k in keys if old.get(k) != doc.get(k)]
    st = os.lstat(path)
    if not differ:
        return Step("keep", path, st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode), "trusted configuration"), old
    shown = ", ".join(f"{k}: {_shown(old.get(k))} -> {_shown(doc.get(k))}" for k in differ)
    if set(differ) <= set(may_change):
        merged = {k: v for k, v in old.items() if k not in may_change or k in doc}
        merged.update({k: doc[k] for k in differ if k in doc})
        return Step("rewrite", path, 0, 0, 0o644, f"trusted configuration ({shown})"), merged
    raise ConfigError(f"{path} already exists with different settings ({shown}); not overwriting it",
                      hint="edit it by hand (man 5 gpubk-config), or move it away and rerun")


def _shown(value) -> str:
    """A config value for people: JSON, and "unset" for a key that is not there."""
    return "unset" if value is None else json.dumps(value)


def plan(options: Options, env: dict, *, may_change: tuple[str, ...] = ()) -> Plan:
    """Everything init would do, checked; changes nothing.  ``may_change``:
    the keys an existing config may have changed (a reconcile of
    ``bk admin install``); init itself never rewrites one."""
    try:
        return _plan(options, env, may_change)
    except PermissionError as e:
        raise PermissionDenied(f"cannot inspect {e.filename}: {e.strerror}",
                               hint="run it as root: sudo bk admin init ...") from None


def _plan(options: Options, env: dict, may_change: tuple[str, ...] = ()) -> Plan:
    options = replace(options, data_dir=_absolute(options.data_dir, "--data-dir"),
                      socket=_absolute(options.socket, "--socket"),
                      config_file=_absolute(options.config_file, "--config-file"))
    if len(os.fsencode(options.socket)) > SUN_PATH_MAX:
        raise InvalidInput(f"--socket {options.socket} is longer than {SUN_PATH_MAX} bytes, the kernel's limit")
    if options.simulated_gpus and options.gpu_count is None:
        raise InvalidInput("simulated GPUs need a count", hint="--simulated-gpus N")
    # No config yet, but a ledger kept from before (an uninstall keeps the
    # data): its bound policy decides, as the installed config would.
    bound = kept_binding(options.data_dir) if not os.path.lexists(options.config_file) else None
    extra: dict = {}
    if bound:
        options, extra = _keep_binding(options, bound)
    if options.gpu_count is None:
        from bk.gpu import NO_DRIVER_LOADED

        reason = gpu_backend_reason(env)
        if reason == NO_DRIVER_LOADED:
            # No driver: no tool can count them, and pointing at one helps nobody.
            raise InvalidInput("--gpu-count is required: no NVIDIA driver is loaded here, so nothing "
                               "can count the GPUs",
                               hint="install and load the NVIDIA driver, then give --gpu-count N; a trial "
                                    "server without GPUs: --simulated-gpus N")
        if reason:
            # The count is bound into the ledger at the first booking and
            # cannot change afterwards: never let a guess become that.
            raise InvalidInput("--gpu-count is required: this bk cannot detect the GPUs here "
                               "(no GPU backend answered)",
                               hint="count them with nvidia-smi -L, then: sudo bk admin init "
                                    "--gpu-count N ...")
    pw = _service_account(options, env)
    group_gid = _group(options)
    doc = config_document(options, pw.pw_uid, pw.pw_gid, extra)
    uid = pw.pw_uid
    if group_gid is None:
        data = _dir_steps(options.data_dir, uid, pw.pw_gid, 0o755, "data directory")
        sock = _dir_steps(os.path.dirname(options.socket), uid, pw.pw_gid, 0o755, "socket directory")
    else:
        data = _dir_steps(options.data_dir, uid, group_gid, 0o750, "data directory")
        sock = _dir_steps(os.path.dirname(options.socket), uid, group_gid, 0o2750, "socket directory")
    steps: list[Step] = []
    for s in data + sock:
        if s.path not in {t.path for t in steps}:
            steps.append(s)
    kept = _existing_config(options.config_file, doc, may_change)
    if kept is None:
        steps += [Step("mkdir", d, 0, 0, 0o755, "configuration directory")
                  for d in _check_ancestors(options.config_file, (0,)) if d not in {t.path for t in steps}]
        steps.append(Step("write", options.config_file, 0, 0, 0o644, "trusted configuration"))
    else:
        step, written = kept
        steps.append(step)
        if step.action == "rewrite":
            doc = written
    return Plan(options, pw.pw_name, uid, pw.pw_gid, group_gid, doc, steps, bound or None)


# ------------------------------------------------------------- applying

def _write_config(step: Step, doc: dict) -> None:
    """A new config (``write``: linked into place, never over one that
    appeared meanwhile), or a changed one (``rewrite``: replaced)."""
    from bk.store.config import check_trusted

    directory, name = os.path.split(step.path)
    data = (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode()
    dirfd = open_dir(directory, Safety(0))
    if dirfd is None:
        raise ConfigError(f"{directory} disappeared while bk admin init ran", hint="inspect it and rerun")
    try:
        # check_trusted: the rule every client will apply, on the real path;
        # overwrite=False links it into place, so a config that appeared
        # meanwhile wins.
        replace_file(dirfd, name, directory, data, 0o644, owner=(0, 0), check=check_trusted,
                     overwrite=step.action == "rewrite")
    except FileExistsError:
        raise ConfigError(f"{step.path} appeared while bk admin init ran; not overwriting it",
                          hint="inspect it and rerun") from None
    finally:
        os.close(dirfd)


def _apply_step(step: Step, doc: dict) -> None:
    if step.action == "mkdir":
        os.mkdir(step.path, 0o700)    # nobody else can get in before chown/chmod below
    if step.action in ("mkdir", "adopt", "chmod"):
        st = os.lstat(step.path)
        if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
            raise ConfigError(f"{step.path} changed while bk admin init ran", hint="inspect it and rerun")
        os.chown(step.path, step.uid, step.gid, follow_symlinks=False)
        os.chmod(step.path, step.mode)   # exact, whatever the umask
        fsync_dir_at(os.path.dirname(step.path))
    elif step.action in ("write", "rewrite"):
        _write_config(step, doc)


def apply(p: Plan, *, euid: int | None = None) -> Result:
    """Carry out the plan (as root).  Stops at the first failure; what was
    done is safe to keep and a rerun continues from there."""
    if (os.geteuid() if euid is None else euid) != 0:
        raise PermissionDenied("bk admin init changes system directories and must run as root",
                               hint="sudo bk admin init ...")
    done: list[Step] = []
    for step in p.changes:
        _apply_step(step, p.config)
        done.append(step)
    verify(p)
    return Result(p, "created" if done else "unchanged", done)


def dry_run(p: Plan) -> Result:
    return Result(p, "dry_run", [])


def verify(p: Plan) -> None:
    """What the broker and every client will check, checked now."""
    from bk.store.config import check_owned_dir, load
    from bk.store.paths import Locations

    o = p.options
    load(Locations("shared", o.data_dir, o.config_file, True, ""))
    check_owned_dir(o.data_dir, p.service_uid, "data directory")
    check_owned_dir(os.path.dirname(o.socket), p.service_uid, "socket directory")
