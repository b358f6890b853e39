"""``bk admin install|uninstall|services|login-hook`` and ``bk update``:
the server's lifecycle.

``bk.admin.install`` plans, ``bk.admin.install_apply`` applies,
``bk.admin.uninstall`` undoes (and ``bk.admin.update`` upgrades); this
module asks the questions, shows the plan, and renders the result.  ``register_admin`` attaches the admin actions to the ``bk admin``
parser (one call from ``bk.cli.cmd_admin``); ``register`` adds ``bk update``.
"""

from __future__ import annotations

import argparse
import os

from bk.cli import common
from bk.cli.render import Output
from bk.core.errors import EXIT_PARTIAL, UsageError
from bk.core.timegrid import counted

INSTALL_EPILOG = """Examples:
  sudo python3 bk.pyz admin install            (guided: one question at a time)
  sudo python3 bk.pyz admin install --dry-run --service-user gpubk --gpu-count 8
  sudo python3 bk.pyz admin install --yes --service-user gpubk --gpu-count 8
  sudo python3 bk.pyz admin install --yes --access group --group gpu-users
  sudo /opt/gpubk/bin/bk admin install --command-path /usr/bin/bk
  sudo python3 bk.pyz admin install --root /tmp/stage --yes --no-start

It installs /opt/gpubk/bk.pyz (bytecode for this interpreter), /opt/gpubk/bin/bk,
the bk command (/usr/local/bin/bk), /etc/gpubk/config.json, /var/lib/gpubk,
gpubk-broker.service and gpubk-monitor.service, the user unit bk-worker.service,
man pages, bash and zsh completion, and with --login-hook /etc/profile.d/gpubk.sh;
then daemon-reload and enable --now (where systemd runs; else it prints the
commands). Everything is recorded in /etc/gpubk/install-manifest.json (root,
0600). Run again, it reconciles: config and data kept, files refreshed,
services restarted; an older archive than the installed one is a downgrade,
asked, or with --yes refused unless --allow-downgrade. Over a data directory
an uninstall kept, the ledger's bound settings (GPU count, slice length,
share slots) are kept. It creates no accounts or groups."""

UNINSTALL_EPILOG = """Examples:
  sudo systemctl disable --now gpubk-monitor.service gpubk-broker.service
  sudo /opt/gpubk/bin/bk admin uninstall --dry-run --purge-data
  sudo /opt/gpubk/bin/bk admin uninstall --purge-data --yes

It removes exactly what the install manifest lists (the units, /opt/gpubk
and the rest) and puts back what was there before. It refuses while a
service runs (exit 75: stop them, then run it again), and when an installed
file was changed by hand (it shows the difference). The data directory stays
unless --purge-data; the backups of bk admin data backup (DATA_DIR-backups,
/var/lib/gpubk-backups) stay even then."""

RUN_EPILOG = """Examples:
  sudo bk admin services run                     until SIGTERM or Ctrl-C
  CMD ["/opt/gpubk/bin/bk", "admin", "services", "run"]    (a Dockerfile's entry point)

For machines where systemd is not PID 1: a container, LXC without systemd,
WSL. It runs gpubk-broker.service and then, once the broker is ready,
gpubk-monitor.service, each as its User=/Group= with the unit's UMask= and
environment (not the sandbox), and makes /run/gpubk as RuntimeDirectory=
would. A service that fails is restarted as its unit says (Restart=,
RestartSec=, RestartPreventExitStatus=, the start limit). SIGTERM, SIGINT
or SIGHUP stops the monitor, then the broker, and exits 0 once both are
reaped; a service that ends for good stops the other and exits 69 (or its
own 75, 77, 78)."""

UPDATE_EPILOG = """Examples:
  bk update                    preview: installed version, this one, the steps
  bk update /tmp/bk-new.pyz    preview an upgrade to that archive
  sudo bk update --apply       stop, replace, reconcile, restart, verify
  sudo bk update /tmp/bk-new.pyz --apply --yes

The verification is bk doctor --probe --strict, run by the new archive; when
it fails, the previous archive is put back and the services restarted. The
same version with the same content is already up to date (nothing is done);
an older archive is a downgrade: asked, or with --yes refused unless
--allow-downgrade."""


def _add_root(p) -> None:
    p.add_argument("--root", metavar="DIR", default=None,
                   help="a staging root: every path lies under DIR (default /; run through a staged "
                        "install's own launcher, that install's root)")


def _settle_root(args) -> None:
    """``--root`` left out: the install this bk runs from (``bk.admin.layout.default_root``)."""
    if args.root is None:
        from bk.admin.layout import default_root

        args.root = default_root()


def register_admin(actions, parser_class) -> None:
    """The admin actions of this module, on ``bk admin``'s sub-parsers."""
    ins = actions.add_parser("install", help="install this server: archive, units, config, command",
                             description="Install bk as a shared-server service, guided unless --yes.",
                             epilog=INSTALL_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    ins.add_argument("--service-user", metavar="USER",
                     help="account that runs the services and owns the data (default: $SUDO_USER)")
    ins.add_argument("--data-dir", metavar="DIR", help="data directory (default /var/lib/gpubk)")
    ins.add_argument("--access", choices=("all", "group"), help="who may use the broker (default all)")
    ins.add_argument("--group", metavar="G", help="the group allowed with --access group")
    ins.add_argument("--gpu-count", metavar="N", type=common.positive_int, help="GPUs to schedule (default: detected)")
    ins.add_argument("--simulated-gpus", metavar="N", type=common.positive_int,
                     help="a trial or CI server without GPUs: schedule N simulated GPUs on purpose, so the "
                          "monitor and bk doctor count the missing driver as intended")
    ins.add_argument("--slot-minutes", metavar="M", type=common.positive_int,
                     help="slice length, a divisor of 60 (default 5)")
    ins.add_argument("--max-shared-users", metavar="N", type=common.positive_int,
                     help="share slots per GPU (default 2)")
    ins.add_argument("--command-path", metavar="PATH",
                     help="where the bk command link goes (default /usr/local/bin/bk, or as installed)")
    ins.add_argument("--no-command-link", dest="command_link", action="store_false", default=None,
                     help="install no bk command link (a reinstall removes the one it made)")
    ins.add_argument("--login-hook", dest="login_hook", action="store_true", default=None,
                     help="also install the login notice hook /etc/profile.d/gpubk.sh")
    ins.add_argument("--no-login-hook", dest="login_hook", action="store_false",
                     help="remove the login hook on a reinstall")
    ins.add_argument("--python", metavar="PATH",
                     help="interpreter the launcher and units use (default: the one running this)")
    ins.add_argument("--admin-contact", metavar="TEXT",
                     help="who bk info names as the administrator (default: the user who ran sudo, "
                          "$SUDO_USER; '' for none)")
    ins.add_argument("--allow-downgrade", action="store_true",
                     help="with --yes, install an archive older than the installed one")
    ins.add_argument("--no-start", dest="start", action="store_false", help="install, but start nothing")
    _add_root(ins)
    ins.add_argument("--destdir", metavar="DIR",
                     help="stage a distribution package's files under DIR, each naming its final path "
                          "(units in /usr/lib/systemd, pages in /usr/share, sysusers.d and tmpfiles.d); "
                          "no configuration, data or manifest; no root needed")
    ins.add_argument("--dry-run", action="store_true", help="show the exact plan; change nothing")
    ins.add_argument("-y", "--yes", action="store_true", help="take the defaults and apply without asking")
    ins.set_defaults(handler=run_install, command="admin install")

    un = actions.add_parser("uninstall", help="remove what admin install installed",
                            description="Remove exactly what the install manifest lists and restore what "
                                        "was there before.",
                            epilog=UNINSTALL_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    un.add_argument("--purge-data", action="store_true", help="also remove the data directory (every booking); "
                    "the backups in DATA_DIR-backups are kept")
    _add_root(un)
    un.add_argument("--dry-run", action="store_true", help="show what would be removed; change nothing")
    un.add_argument("-y", "--yes", action="store_true", help="do not ask")
    un.set_defaults(handler=run_uninstall, command="admin uninstall")

    sv = actions.add_parser("services", help="the broker and monitor: install, status, run, uninstall",
                            description="The broker and monitor units, apart from the rest of the install.",
                            epilog="Examples:\n  sudo bk admin services status\n"
                                   "  sudo bk admin services install\n"
                                   "  sudo bk admin services run        (no systemd: a container, LXC, WSL)\n"
                                   "  sudo /opt/gpubk/bin/bk admin services uninstall --yes",
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    sv.set_defaults(handler=_missing, command="admin services")
    sacts = sv.add_subparsers(dest="services_action", metavar="ACTION", parser_class=parser_class)
    for name, helptext in (("install", "write (refresh) the units, daemon-reload, enable --now"),
                           ("status", "whether the services run (systemd, or the socket and locks)"),
                           ("run", "run the broker and monitor in the foreground as their units' accounts, "
                                   "without systemd"),
                           ("uninstall", "remove the units (the services must be stopped)")):
        q = sacts.add_parser(name, help=helptext, description=helptext[0].upper() + helptext[1:] + ".",
                             **({"epilog": RUN_EPILOG, "formatter_class": argparse.RawDescriptionHelpFormatter}
                                if name == "run" else {}))
        _add_root(q)
        if name not in ("status", "run"):
            q.add_argument("--dry-run", action="store_true", help="show the plan; change nothing")
            q.add_argument("-y", "--yes", action="store_true", help="do not ask")
        if name == "install":
            q.add_argument("--no-start", dest="start", action="store_false", help="start nothing")
        q.set_defaults(handler=run_services, command=f"admin services {name}", services_action=name)

    lh = actions.add_parser("login-hook", help="the login notice: install, status, uninstall",
                            description="/etc/profile.d/gpubk.sh: once per interactive login it prints "
                                        "what bk login has to say, within one second, silent on error.",
                            epilog="Examples:\n  sudo bk admin login-hook install\n  bk admin login-hook status\n"
                                   "  sudo bk admin login-hook uninstall",
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    lh.set_defaults(handler=_missing, command="admin login-hook")
    lacts = lh.add_subparsers(dest="hook_action", metavar="ACTION", parser_class=parser_class)
    for name in ("install", "status", "uninstall"):
        q = lacts.add_parser(name, help=f"{name} the login hook", description=f"{name.capitalize()} the login hook.")
        _add_root(q)
        if name != "status":
            q.add_argument("--dry-run", action="store_true", help="show the plan; change nothing")
        q.set_defaults(handler=run_login_hook, command=f"admin login-hook {name}", hook_action=name)


def register(sub) -> None:
    p = sub.add_parser("update", help="upgrade the installed server: preview, or --apply",
                       description="Preview an upgrade of the installed bk (this archive, or NEW.pyz); "
                                   "with --apply (as root) stop, replace, reconcile, restart and verify, "
                                   "rolling back on failure.",
                       epilog=UPDATE_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("archive", metavar="NEW.pyz", nargs="?", help="the archive to install (default: this bk)")
    p.add_argument("--apply", action="store_true", help="perform the upgrade (root)")
    p.add_argument("--python", metavar="PATH", help="interpreter for the new archive (default: as installed)")
    p.add_argument("--allow-downgrade", action="store_true",
                   help="with --apply --yes, install an archive older than the installed one")
    _add_root(p)
    p.add_argument("-y", "--yes", action="store_true", help="do not ask")
    p.set_defaults(handler=run_update, command="update")


def _missing(args, ctx) -> Output:
    raise UsageError("which action?", hint=f"see: bk help {args.command}")


# ------------------------------------------------------------- install

# The exact line that makes a service account bk can use (it creates none).
USERADD = "sudo useradd --system --no-create-home --shell /usr/sbin/nologin"
DETECTED = "detected"

VERBS = {"create": "create", "update": "refresh", "replace": "replace", "adopt": "adopt", "keep": "keep",
         "skip": "leave alone", "mkdir": "create", "link": "link", "remove": "remove",
         "adopt_dir": "take over", "chmod": "set owner/mode", "write": "write",
         "rewrite": "rewrite"}


# init's reasons, which the role already says.
INIT_WHYS = ("parent directory", "data directory", "socket directory", "configuration directory",
             "trusted configuration")


def _plan_lines(plan, *, all_steps: bool = False) -> list[str]:
    from bk.admin.layout import group_name, owner_name

    lines = []
    for a in plan.actions:
        if not all_steps and not a.changes and a.op != "skip":
            continue
        op = a.step.action if a.step is not None else a.op
        verb = {"adopt": "take over"}.get(op, VERBS.get(op, op)) if a.step is not None else VERBS.get(op, op)
        what = f"-> {a.target}" if a.kind == "link" else f"({owner_name(a.uid)}:{group_name(a.gid)} {a.mode:04o})"
        why = f"; {a.why}" if a.why and a.why not in INIT_WHYS else ""
        lines.append(f"  {verb:<12} {a.path}  {what}  [{a.role}{why}]")
    return lines or ["  nothing to change: every file is in place"]


def _install_text(result, command: str = "admin install") -> str:
    """The plan or its outcome, headed by the command the person ran (``bk
    admin services install`` runs the same reconcile and says so)."""
    p = result.plan
    head = f"bk {command}" + {"dry_run": " would:", "installed": " did:", "reconciled": " reconciled:",
                              "unchanged": ": everything is in place:", "review": " will:"}[result.status]
    ip = p.init_plan
    lines = [head, *_plan_lines(p)]
    lines.append(f"bk {p.version} from {p.archive_from}, run by {p.python}")
    lines.append(f"service account: {ip.service_user} (uid {ip.service_uid}); access: {ip.options.access}"
                 + (f" (group {ip.options.group})" if ip.options.group else "")
                 + f"; GPUs: {ip.config.get('gpu_count', 'detected')}")
    if not p.reconcile:
        lines.append(f"administrator contact (bk info): {ip.config.get('admin_contact') or 'none'}")
    if ip.kept:
        lines.append(f"kept data: the ledger in {ip.options.data_dir} binds "
                     + ", ".join(f"{k} {v}" for k, v in sorted(ip.kept.items())) + "; the configuration keeps it")
    if p.downgrade:
        lines.append(f"DOWNGRADE: bk {p.installed_version} is installed; this archive is the older bk {p.version}")
    if result.status == "dry_run" or result.status == "review":
        if p.systemd:
            lines.append("then: " + "; ".join(" ".join(c) for c in p.service_commands))
    lines += result.notes
    if result.status in ("installed", "reconciled", "unchanged"):
        lines.append("check it: bk doctor --probe --require-monitor --strict")
    return "\n".join(lines)


def _options(args, **over):
    from bk.admin.install import Options

    gpu_count, simulated = common.simulated_gpu_count(args.gpu_count, args.simulated_gpus)
    o = Options(root=args.root, service_user=args.service_user, data_dir=args.data_dir, access=args.access,
                group=args.group, gpu_count=gpu_count, slot_minutes=args.slot_minutes,
                max_shared_users=args.max_shared_users, command_path=args.command_path,
                command_link=args.command_link, login_hook=args.login_hook, python=args.python,
                start=args.start, simulated_gpus=gpu_count if simulated else None,
                destdir=args.destdir, admin_contact=args.admin_contact)
    from bk.core.record import replace

    return replace(o, **over) if over else o


def _guided(args, ctx):
    """One question at a time, defaults in brackets; returns the options."""
    import grp
    import pwd

    from bk.admin import init, install
    from bk.admin.layout import Layout, target
    from bk.cli.guided import Dialog, Question
    from bk.core.errors import InvalidInput

    def user(text: str) -> str:
        try:
            if pwd.getpwnam(text).pw_uid == 0:
                raise InvalidInput("the service account must not be root")
        except KeyError:
            raise InvalidInput(f"there is no account {text!r}; create it first: {USERADD} {text}") from None
        return text

    def gpus(text: str) -> int | None:
        return None if text == DETECTED else common.positive_int(text)

    def contact(text: str) -> str:
        return "" if text.lower() in ("none", "-") else text

    def group(text: str) -> str:
        try:
            grp.getgrnam(text)
        except KeyError:
            raise InvalidInput(f"there is no group {text!r}; create it first: sudo groupadd {text}") from None
        return text

    def yesno(text: str) -> bool:
        t = text.strip().lower()
        if t in ("y", "yes"):
            return True
        if t in ("n", "no"):
            return False
        raise InvalidInput("answer y or n")

    def access(text: str) -> str:
        if text not in ("all", "group"):
            raise InvalidInput("answer all or group")
        return text

    def absolute(text: str) -> str:
        if not os.path.isabs(text):
            raise InvalidInput("an absolute path, please")
        return text

    # Every default is what --yes would take.  Over a data directory an
    # uninstall kept, the ledger's bound settings are not asked: they stay.
    layout = Layout(os.path.normpath(args.root))
    data_dir = args.data_dir or "/var/lib/gpubk"
    kept = init.kept_binding(target(layout, data_dir, "--data-dir") or data_dir) or {}
    unasked = {k for k in init.BOUND_OPTIONS if k in kept}
    dialog = Dialog.terminal()
    if unasked:
        dialog.say(f"{data_dir} keeps a ledger: its GPU count ({kept.get('gpu_count')}), slices "
                   f"({kept.get('slot_minutes')} min) and share slots ({kept.get('max_shared_users')}) stay.")
    given, simulated = common.simulated_gpu_count(args.gpu_count, args.simulated_gpus)
    detectable = given is None and "gpu_count" not in kept and init.gpus_detectable(ctx.env)
    questions = [
        Question("service_user", "Service account (runs the broker and monitor, owns the data)", user,
                 args.service_user or ctx.env.get("SUDO_USER") or None,
                 help=f"an existing non-root account; bk creates none: {USERADD} gpubk"),
        Question("admin_contact", "Administrator contact shown by bk info", contact,
                 args.admin_contact or install.default_contact(ctx.env) or "none",
                 help="a name, a room, an address: whom users ask about this server; none for no contact"),
        Question("gpu_count", "How many GPUs to schedule", gpus,
                 str(given) if given else DETECTED if detectable else None,
                 when=lambda a: "gpu_count" not in unasked,
                 help="nvidia-smi -L counts them" + ("; detected: bk counts them at every start" if detectable
                                                     else "")),
        Question("access", "Who may book: all users, or one group (all/group)",
                 access, args.access or "all"),
        Question("group", "Which group", group, args.group, when=lambda a: a.get("access") == "group"),
        Question("slot_minutes", "Slice length in minutes", common.positive_int, str(args.slot_minutes or 5),
                 when=lambda a: "slot_minutes" not in unasked),
        Question("max_shared_users", "Share slots per GPU", common.positive_int, str(args.max_shared_users or 2),
                 when=lambda a: "max_shared_users" not in unasked),
        Question("data_dir", "Data directory", absolute, data_dir),
        Question("command_path", "The bk command", absolute, args.command_path or "/usr/local/bin/bk"),
        Question("login_hook", "Show notices at login", yesno, "y" if args.login_hook else "n",
                 shown="Y/n" if args.login_hook else "y/N"),
    ]
    answers = dialog.run(questions)
    if simulated and isinstance(answers.get("gpu_count"), int):
        answers["simulated_gpus"] = answers["gpu_count"]     # --simulated-gpus: the count asked is simulated
    for key, default in (("slot_minutes", 5), ("max_shared_users", 2)):
        if answers.get(key) == default and getattr(args, key) is None:
            answers[key] = None             # the default, left unsaid in the config as --yes leaves it
    return _options(args, **{k: v for k, v in answers.items() if k in (
        "service_user", "admin_contact", "gpu_count", "access", "group", "slot_minutes", "max_shared_users",
        "data_dir", "command_path", "login_hook", "simulated_gpus")})


def _command_line(o, plan) -> str:
    """The non-interactive command that installs what the options say, for a
    person to run later: from the same archive (``sudo python3 bk.pyz``),
    or the ``bk`` of the installed package."""
    import shlex

    source = plan.archive_from
    prog = ["python3", source] if os.path.isabs(source) and source.endswith(".pyz") else ["bk"]
    words = ["sudo", *prog, "admin", "install", "--yes"]
    for flag, value in (("--service-user", o.service_user), ("--admin-contact", o.admin_contact),
                        ("--gpu-count", o.gpu_count), ("--access", o.access), ("--group", o.group),
                        ("--slot-minutes", o.slot_minutes), ("--max-shared-users", o.max_shared_users),
                        ("--data-dir", o.data_dir), ("--command-path", o.command_path), ("--python", o.python)):
        if value is not None:
            words += [flag, str(value)]
    if o.login_hook:
        words.append("--login-hook")
    if o.root != "/":
        words += ["--root", o.root]
    if not o.start:
        words.append("--no-start")
    return " ".join(shlex.quote(w) for w in words)


def run_install(args, ctx) -> Output:
    if args.destdir is not None:
        args.root = args.root or "/"        # --destdir never acts on the install it runs from
        return _stage(args, _options(args))
    _settle_root(args)
    from bk.admin import install, install_apply
    from bk.admin.layout import Layout

    options = _options(args)
    reinstall = os.path.exists(Layout(os.path.normpath(args.root)).config) if os.path.isabs(args.root) \
        else False
    if not args.yes and not args.dry_run and ctx.interactive and not reinstall:
        from bk.cli.guided import Cancelled

        try:
            options = _guided(args, ctx)
        except Cancelled:
            return Output("admin install", {"status": "declined"}, "nothing changed", exit_code=EXIT_PARTIAL)
    plan = install.plan(options, ctx.env)
    if args.dry_run:
        result = install.dry_run(plan)
        return Output("admin install", result.to_json(), lambda term: _install_text(result),
                      warnings=list(plan.warnings))
    from bk.admin.layout import need_root

    need_root("bk admin install")
    if plan.changes and not args.yes:
        if not ctx.interactive:
            raise UsageError("bk admin install changes the system; confirm with --yes",
                             hint="review first: sudo bk admin install --dry-run ...")
        review = install.Result(plan, "review", [])
        print(_install_text(review))
        for w in plan.warnings:
            print(f"warning: {w}")
        # The person has just read the plan: Enter applies it; a downgrade
        # is asked as one, and Enter keeps what is installed.
        question = (f"Downgrade bk {plan.installed_version} to {plan.version}?" if plan.downgrade
                    else "Apply this plan?")
        if not ctx.confirm(question, default=not plan.downgrade):
            return Output("admin install", install.dry_run(plan).to_json() | {"status": "declined"},
                          "nothing changed; to apply this plan later: " + _command_line(options, plan)
                          + (" --allow-downgrade" if plan.downgrade else ""), exit_code=EXIT_PARTIAL)
    elif plan.downgrade and not args.allow_downgrade:
        raise UsageError(f"bk {plan.installed_version} is installed and this archive is bk {plan.version}, "
                         "older: a downgrade; nothing was changed",
                         hint="add --allow-downgrade to install it anyway (docs/UPGRADING.md: what a downgrade "
                              "keeps)", details={"installed_version": plan.installed_version,
                                                 "version": plan.version})
    result = install_apply.apply(plan)
    return Output("admin install", result.to_json(), lambda term: _install_text(result),
                  warnings=list(plan.warnings),
                  done=None if result.status == "unchanged" else f"bk admin install {result.status}")


def _stage(args, options) -> Output:
    """``--destdir``: the package payload, no questions (a build runs unattended)."""
    from bk.admin import destdir

    staged = destdir.stage(options, dry_run=args.dry_run)

    def human(term) -> str:
        head = f"bk admin install --destdir {staged.destdir} " + ("would stage:" if staged.dry_run else "staged:")
        lines = [head, *[f"  {path}  [{role}]" for path, role in staged.files]]
        if staged.link:
            lines.append(f"  {staged.link[0]} -> {staged.link[1]}  [command]")
        lines.append(f"bk {staged.version} from {staged.archive_from}, for {staged.python}; "
                     f"the units run as {staged.user}")
        lines.append("on the server, once the package is installed:")
        lines += [f"  {c}" for c in staged.next_steps()]
        return "\n".join(lines)

    return Output("admin install", staged.to_json(), human,
                  done=None if staged.dry_run else f"bk admin install staged {counted(len(staged.files), 'file')}")


# ------------------------------------------------------------- uninstall

def _removal_lines(up) -> list[str]:
    verbs = {"remove": "remove", "restore": "restore", "rmdir": "remove dir", "purge": "purge",
             "keep": "keep", "gone": "already gone"}
    lines = [f"  {verbs[r.op]:<12} {r.entry.path}  [{r.entry.role}{'; ' + r.why if r.why else ''}]"
             for r in up.removals] or ["  nothing"]
    return lines + [f"  {'keep':<12} {path}  [backups; bk admin data backup made them, remove them by hand]"
                    for path in up.kept]


def run_uninstall(args, ctx) -> Output:
    _settle_root(args)
    from bk.admin import uninstall

    up = uninstall.uninstall_plan(args.root, purge_data=args.purge_data)
    return _do_uninstall(args, ctx, up, "admin uninstall")


def _do_uninstall(args, ctx, up, command: str) -> Output:
    from bk.admin import uninstall

    data = up.to_json()
    if args.dry_run:
        lines = [f"bk {command} would:", *_removal_lines(up)]
        if up.running:
            lines.append("but first stop the services: " + "; ".join(up.running))
        return Output(command, data | {"status": "dry_run", "dry_run": True}, "\n".join(lines))
    from bk.admin.layout import need_root

    need_root(f"bk {command}")
    if not args.yes:
        if not ctx.interactive:
            raise UsageError(f"bk {command} removes files; confirm with --yes",
                             hint=f"look first: sudo bk {command} --dry-run")
        print("\n".join([f"bk {command} will:", *_removal_lines(up)]))
        if not ctx.confirm("Remove these?"):
            return Output(command, data | {"status": "declined", "dry_run": False}, "nothing changed",
                          exit_code=EXIT_PARTIAL)
    # Run from the installed archive, this command deletes it: load what
    # the rest of it needs (rendering, the exit path) while it is there.
    import textwrap  # noqa: F401

    import bk.cli.main  # noqa: F401
    from bk.admin import services  # noqa: F401

    done = uninstall.uninstall(up)
    lines = [f"bk {command} did:", *[ln for ln in _removal_lines(up)]]
    if up.systemd:                                  # the unit files are gone: tell systemd
        services.run([["systemctl", "daemon-reload"]])
    if not up.only_services:
        if os.path.isdir(up.layout.opt):
            lines.append(f"left: {up.layout.opt}, which bk did not make or which holds files bk did not install; "
                         f"remove it by hand if nothing else needs it: sudo rm -rf {up.layout.opt}")
        lines.append("shells that ran bk remember where it was: hash -r")
    return Output(command, data | {"status": "removed", "dry_run": False,
                                   "removed": [r.entry.path for r in done]}, "\n".join(lines),
                  done=f"bk {command}: removed {counted(len(done), 'path')}")


# ------------------------------------------------------------- services

def run_services(args, ctx) -> Output:
    _settle_root(args)
    from bk.admin import install, install_apply, services, uninstall
    from bk.admin.layout import Layout

    layout = Layout(os.path.normpath(args.root))
    if args.services_action == "status":
        from bk.admin import manifest as mf

        m = mf.load(layout.config_dir) if os.access(layout.config_dir, os.R_OK) else None
        opts = m.options if m else {}
        st = services.status(layout.root, opts.get("socket") or layout.socket,
                             opts.get("data_dir") or layout.p("/var/lib/gpubk"))
        units = {u: os.path.exists(os.path.join(layout.unit_dir, u)) for u in services.UNITS}
        st["units"] = units
        running = bool(st["active_units"]) if st["systemd"] else bool(st["running"])
        st["status"] = "running" if running else "stopped"

        def human(term) -> str:
            lines = [f"services: {st['status']}" + ("" if st["systemd"] else " (systemd is not running here; "
                                                   "judged from the broker socket and the writers' locks)")]
            lines += [f"  {u}: {'installed' if ok else 'not installed'}" for u, ok in units.items()]
            lines += [f"  {r}" for r in st["running"]]
            if st["systemd"]:
                lines.append("  active: " + (", ".join(st["active_units"]) or "none"))
            return "\n".join(lines)

        return Output("admin services status", st, human)
    if args.services_action == "uninstall":
        up = uninstall.uninstall_plan(args.root, only_services=True)
        return _do_uninstall(args, ctx, up, "admin services uninstall")
    if args.services_action == "run":
        from bk.admin import supervise

        got = supervise.run(layout, ctx.env)
        if got.status == "failed":
            from bk.core import errors

            cls = {errors.EXIT_TEMPFAIL: errors.Busy, errors.EXIT_WRONG_ACCOUNT: errors.WrongAccount,
                   errors.EXIT_CONFIG: errors.ConfigError}.get(got.exit_code, errors.Unavailable)
            raise cls(f"the services stopped: {got.reason}",
                      hint="its log is above; bk doctor --probe --require-monitor --strict checks the rest",
                      details=got.to_json())

        def ran(term) -> str:
            lines = [f"services {got.reason}:"]
            lines += [f"  {s['unit']}: started {counted(s['starts'], 'time')}, last "
                      + ("exit: none" if s["last_exit"] is None else f"exit {s['last_exit']}")
                      for s in got.services]
            return "\n".join(lines)

        return Output("admin services run", got.to_json(), ran, exit_code=got.exit_code)
    # install: the whole reconcile, which refreshes the units among the rest.
    from bk.core.record import replace

    options = replace(install.Options(root=args.root), start=args.start)
    plan = install.plan(options, ctx.env, doing="bk admin services install")
    if args.dry_run:
        result = install.dry_run(plan)
        return Output("admin services install", result.to_json(),
                      lambda term: _install_text(result, "admin services install"))
    from bk.admin.layout import need_root

    need_root("bk admin services install")
    if plan.downgrade:
        raise UsageError(f"bk {plan.installed_version} is installed and this archive is bk {plan.version}, "
                         "older: refreshing the units would downgrade it; nothing was changed",
                         hint="run the installed bk: sudo /opt/gpubk/bin/bk admin services install (or "
                              "sudo bk admin install --allow-downgrade to downgrade)")
    result = install_apply.apply(plan)
    return Output("admin services install", result.to_json(),
                  lambda term: _install_text(result, "admin services install"))


# ------------------------------------------------------------- login hook

def run_login_hook(args, ctx) -> Output:
    _settle_root(args)
    from bk.admin import install, install_apply, loginhook
    from bk.admin.layout import Layout

    layout = Layout(os.path.normpath(args.root))
    if args.hook_action == "status":
        st = loginhook.status(layout)
        return Output("admin login-hook status", st, f"login hook: {st['status']} ({st['path']})")
    if args.hook_action == "uninstall":
        st = loginhook.status(layout)
        if st["status"] in ("absent", "foreign"):
            # Nothing of bk's to remove: a hook bk never installed is not
            # its to delete, and needs neither root nor an installed bk.
            why = ("no login hook" if st["status"] == "absent" else
                   "not bk's login hook (bk did not install it): left in place")
            return Output("admin login-hook uninstall", {"status": "unchanged", "dry_run": args.dry_run,
                                                         "hook": st},
                          f"login hook: {st['status']} ({st['path']}): {why}; nothing to remove")
    loginhook.require_installed(layout)
    options = install.Options(root=args.root, login_hook=args.hook_action == "install")
    plan = install.plan(options, ctx.env, doing=f"bk admin login-hook {args.hook_action}",
                        roles=(loginhook.ROLE,))
    # Only the hook (and the directory it needs); the rest is left to a reconcile.
    plan.actions = [a for a in plan.actions if a.role == "login-hook"
                    or a.op == "mkdir" and layout.hook.startswith(a.path + "/")]
    if args.dry_run:
        result = install.dry_run(plan)
        return Output(f"admin login-hook {args.hook_action}", result.to_json(),
                      lambda term: "\n".join([f"bk admin login-hook {args.hook_action} would:", *_plan_lines(plan)]))
    from bk.admin.layout import need_root

    need_root(f"bk admin login-hook {args.hook_action}")
    result = install_apply.apply(plan)
    st = loginhook.status(layout)
    return Output(f"admin login-hook {args.hook_action}", result.to_json() | {"hook": st},
                  lambda term: f"login hook: {st['status']} ({st['path']})")



# ------------------------------------------------------------- update

def run_update(args, ctx) -> Output:
    _settle_root(args)
    from bk.admin import update

    up = update.plan(args.root, args.archive, python=args.python)
    if not args.apply or up.up_to_date:
        status = "up_to_date" if up.up_to_date else "plan"
        return Output("update", up.to_json() | {"status": status}, lambda term: update.plan_text(up))
    from bk.admin.layout import need_root

    need_root("bk update --apply")
    if not args.yes:
        if not ctx.interactive:
            raise UsageError("bk update --apply replaces the installed archive; confirm with --yes",
                             hint="preview first: bk update")
        print(update.plan_text(up))
        # The plan was just read: Enter upgrades; a downgrade needs a yes.
        if not ctx.confirm("Downgrade now?" if up.downgrade else "Upgrade now?", default=not up.downgrade):
            return Output("update", up.to_json() | {"status": "declined"}, "nothing changed",
                          exit_code=EXIT_PARTIAL)
    elif up.downgrade and not args.allow_downgrade:
        raise UsageError(f"bk {up.installed_version} is installed and {up.new_source} is bk {up.new_version}, "
                         "older: a downgrade; nothing was changed",
                         hint="add --allow-downgrade to install it anyway (docs/UPGRADING.md: what a downgrade "
                              "keeps)", details={"installed_version": up.installed_version,
                                                 "new_version": up.new_version})
    result = update.apply(up, ctx.env)
    return Output("update", result.to_json(), lambda term: update.result_text(result),
                  exit_code=0 if result.status == "updated" else 1,
                  done=f"bk update: {result.status}")
