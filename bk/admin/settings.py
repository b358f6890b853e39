"""Which settings an install uses: the flags, completed from what is
already installed.

A second run of install is a reconcile: it must not need every flag again,
and it must not change what cannot change.  The GPU count, the slot length
and the share slots are bound into the ledger at its first booking; the
service account and the data directory are what the files on disk already
belong to.  So the installed config supplies the flags not given, and a
flag that disagrees with it is refused by name before anything changes.  A
flag given with its default value, which the config leaves unsaid, is not a
disagreement.

What a reconcile may change (``CHANGEABLE``): the access rule and its group
(``--access group --group G``: the config, the units' ``Group=`` and
``RuntimeDirectoryMode=``, and the data and socket directories' group and
mode are all rewritten, GUIDE 5.6), and ``--simulated-gpus N`` for the
count already installed.

The interpreter comes from ``--python``, else the manifest's record of the
last install, else the one running the installer; it must be one the
services can see (``ProtectHome=yes``) and every user can run, and its path
must be one a unit can name unquoted.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

from bk.admin import init, units
from bk.admin import manifest as mf
from bk.admin.layout import Layout, target
from bk.core.errors import InvalidInput
from bk.users import user_name

if TYPE_CHECKING:
    from bk.admin import install

BOUND_FLAGS = {"gpu_count": "--gpu-count", "slot_minutes": "--slot-minutes",
               "max_shared_users": "--max-shared-users"}
OWNER_FLAGS = {"service_user": "--service-user", "data_dir": "--data-dir"}
# Config keys a reconcile rewrites when the flags say so (init.plan's may_change).
CHANGEABLE = ("access", "group", "simulated_gpus")


def existing_config(path: str) -> dict | None:
    """The installed trusted config (checked like every client checks it), or None."""
    if not os.path.lexists(path):
        return None
    doc = init.read_trusted(path, "fix it, then rerun")
    return doc if isinstance(doc, dict) else None


def settle(options: install.Options, layout: Layout, cfg: dict | None) -> init.Options:
    """init's options: the flags, with what the installed config says for the
    ones not given; a flag that disagrees with the installed config is refused."""
    data_dir = target(layout, options.data_dir, "--data-dir")
    given = {"gpu_count": options.gpu_count, "slot_minutes": options.slot_minutes,
             "max_shared_users": options.max_shared_users, "data_dir": data_dir}
    wanted = {"access": options.access, "group": options.group,
              "simulated_gpus": True if options.simulated_gpus is not None else None}
    if cfg is not None:
        user = None
        if "service_uid" in cfg:
            try:
                user = user_name(int(cfg["service_uid"]))
            except (ValueError, TypeError):
                user = None
        have = {"gpu_count": cfg.get("gpu_count"), "slot_minutes": cfg.get("slot_minutes"),
                "max_shared_users": cfg.get("max_shared_users"), "data_dir": cfg.get("data_dir")}
        bound, owned = [], []
        for key, default in (("slot_minutes", 5), ("max_shared_users", 2)):
            if have[key] is None and given[key] == default:
                given[key] = None       # the default, which the config leaves unsaid
        for key in ("slot_minutes", "max_shared_users"):
            have[key] = have[key] if have[key] is not None else {"slot_minutes": 5, "max_shared_users": 2}[key]
        for key, value in given.items():
            if value is not None and value != have[key] and not (key == "gpu_count" and have[key] is None):
                installed = "unset" if have[key] is None else have[key]
                shown = f"{BOUND_FLAGS.get(key) or OWNER_FLAGS[key]} {value} (installed: {installed})"
                (bound if key in BOUND_FLAGS else owned).append(shown)
        if options.service_user is not None and user is not None and options.service_user != user:
            owned.append(f"--service-user {options.service_user} (installed: {user})")
        if bound:
            raise InvalidInput("these flags would change settings bound into the ledger at its first booking: "
                               + "; ".join(bound) + "; nothing was changed",
                               hint="leave them out to keep the installed ones (a reinstall keeps config and "
                                    "data); a new GPU count means a new ledger: see bk-admin(8)")
        if owned:
            raise InvalidInput("these flags disagree with the installed configuration: " + "; ".join(owned)
                               + "; nothing was changed",
                               hint="leave them out to keep the installed ones, or uninstall first")
        merged = {k: (v if v is not None else cfg.get(k)) for k, v in given.items()}
        merged |= _access(wanted, cfg)
        service_user = options.service_user or user
    else:
        merged = dict(given) | wanted
        service_user = options.service_user
    return init.Options(service_user=service_user, data_dir=merged["data_dir"] or layout.p("/var/lib/gpubk"),
                        socket=layout.socket, access=merged["access"] or "all", group=merged["group"],
                        gpu_count=merged["gpu_count"], slot_minutes=merged["slot_minutes"],
                        max_shared_users=merged["max_shared_users"], config_file=layout.config,
                        simulated_gpus=bool(merged["simulated_gpus"]))


def _access(wanted: dict, cfg: dict) -> dict:
    """access, group and simulated_gpus for a reconcile: the flags given,
    the installed config for the rest.  ``--access all`` drops the group;
    ``--group G`` alone keeps (or, on an ``all`` server, asks for) group
    access, which init then checks."""
    access = wanted["access"] or cfg.get("access", "all")
    group = wanted["group"] if wanted["group"] is not None else (
        None if wanted["access"] == "all" else cfg.get("group"))
    simulated = wanted["simulated_gpus"] if wanted["simulated_gpus"] is not None else cfg.get("simulated_gpus")
    return {"access": access, "group": group, "simulated_gpus": simulated}


def interpreter(options: install.Options, m: mf.Manifest | None) -> str:
    """The interpreter the launcher and the archive's bytecode are for."""
    python = options.python or (m.options.get("python") if m else None) or sys.executable
    if not python or not os.path.isabs(python):
        raise InvalidInput(f"--python must be an absolute path, got {python!r}")
    if not os.access(python, os.X_OK):
        raise InvalidInput(f"{python} is not an executable interpreter", hint="e.g. --python /usr/bin/python3")
    units.check_path(python, "the interpreter")      # the launcher and units name it unquoted
    real = os.path.realpath(python)
    if real.startswith(("/home/", "/root/", "/run/user/")):
        # ProtectHome=yes in both units hides these from the services, and
        # other users usually cannot run an interpreter in root's home.
        raise InvalidInput(f"the interpreter {python} lives in a home directory ({real}), which the "
                           "services cannot see (ProtectHome=yes) and other users may not run",
                           hint="name a system interpreter: --python /usr/bin/python3")
    _root_only_interpreter(python, real)
    return python


def _root_only_interpreter(python: str, real: str) -> None:
    """The interpreter runs as root (the compiler, ``sudo bk ...``) and as
    every user: the file it is, and every directory on the way to it as
    named and as resolved, must be root's alone (``bk.admin.rootenv``)."""
    import stat

    from bk.store.fsutil import unsafe_ancestor

    # The directory that holds the name the launcher uses, and the one that
    # holds the file it resolves to, each with every directory above it.
    for directory in dict.fromkeys((os.path.realpath(os.path.dirname(python)), os.path.dirname(real))):
        bad = unsafe_ancestor(directory, (0,), sticky_ok=False)
        if bad is not None:
            where, st, why = bad
            owner = f"owner uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o}" if st is not None else why
            raise InvalidInput(f"the interpreter {python} lies below {where}, which someone other than root can "
                               f"change ({owner}); it would run as root and as every user",
                               hint="name a system interpreter: --python /usr/bin/python3")
    st = os.stat(real)
    if st.st_uid != 0 or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise InvalidInput(f"the interpreter {real} can be changed by someone other than root (owner uid "
                           f"{st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o}); it would run as root and as every user",
                           hint="name a system interpreter: --python /usr/bin/python3")
