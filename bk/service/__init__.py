"""The service layer's one face: the operation table, and the service that runs it.

Every front end (the CLI and its prompt, the TUI, ``bk mcp`` and ``bk
agent``, the broker, the cluster's node) reaches the service the same way:
open the service for this process (``open_app``), build a typed request
(``bk.service.builders`` for words a person typed), run one row of the table
(``service.run(name, request, call=call)``) and render the typed result it
returns (``to_json()`` is the JSON every front end shows).  ``__all__``
names that face; the modules under it are the rows' own business.

A row names the request type and its field spec, the result type, whether
it reads or writes, who may call it, and whether a retry is harmless or it
destroys something.  Everything else is derived from the table:

* the broker's allowlist and decoder (``bk.broker.handlers``: an op not in
  the table, or not ``served``, is refused before any code runs);
* the client side (``bk.service.gateway.BrokerGateway``: encode the request
  with the spec, rebuild the result with the result type);
* the local side (``LocalGateway``: run ``apply`` in one transaction, or
  ``serve`` for a read only the host may make);
* the agent surface (``bk.agent``: ``bk mcp`` tools, ``bk agent``): input
  schemas from ``schema``, hints from access/destructive/idempotent.

A row with ``served=False`` is never a broker operation: it is a read
anyone may make from the committed ledger or their own files (or a change
to their own private files, a preset), so every caller runs its ``serve``
in its own process (``Service.run``); ``served()`` is the broker's
allowlist.  A row's ``explain`` words a refusal for the caller, in the
caller's process and zone, from the facts its apply put in the error's
details (the ``book`` row's nearest start that fits), so both gateways and
every front end say the same.

Every request, field spec, result and function of a row is named as
``"module:attr"`` of this package (``"booking:apply_book"``): the module is
imported when the row's value is first used, so ``bk l`` loads the list row's module and nothing of the writes,
the agent surface or the jobs.  Adding a write is one apply function plus
one row.

``open_app(env)`` reads the configuration and returns the service for this
process: in private mode one whose operations run on the local ledger, in
shared mode one whose reads come from the committed ledger file and whose
operations go to the broker.  Tests inject the actor, the clock and the GPU
backend instead of patching.
"""

from __future__ import annotations

from bk.core.errors import InvalidInput
from bk.core.record import dataclass

READ, WRITE = "read", "write"
ANYONE, OWNER, ADMIN = "anyone", "owner", "admin"
HOST = "host"       # whoever owns the data: you in private mode, root on a shared server

# The bk release whose nodes first answer rows over ssh (``bk c node --row``,
# docs/CLUSTER.md): a row's ``since`` is this or the release that added it,
# and a cluster client refuses, before sending it, a row newer than the node.
ROWS_SINCE = "0.1.0"


def version_tuple(text: object) -> tuple[int, ...]:
    """``"0.10.2"`` -> ``(0, 10, 2)``; anything else (a dev suffix ends the
    numbers) compares as the oldest."""
    out = []
    for part in str(text).split("."):
        digits = ""
        for ch in part:
            if not ch.isdigit():
                break
            digits += ch
        if not digits:
            break
        out.append(int(digits))
        if len(digits) != len(part):
            break
    return tuple(out)

_LAZY = frozenset({"request", "fields", "result", "apply", "serve", "check", "explain"})


def _resolve(ref: str):
    """``"booking:apply_book"`` -> ``bk.service.booking.apply_book``: a row
    names only modules of this package, so no arrow out of the service layer
    can hide in a string."""
    module, _, attr = ref.partition(":")
    return getattr(__import__(f"bk.service.{module}", fromlist=(attr,)), attr)


@dataclass(frozen=True)
class Operation:
    name: str
    summary: str                      # "book GPUs"; also the MCP tool description's first line
    request: object                   # each of these may be "module:attr" (module docstring)
    fields: object                    # None: an in-process row (it has nothing a program may send)
    result: object
    access: str                       # READ | WRITE
    who: str                          # ANYONE | OWNER (the apply checks ownership) | ADMIN | HOST (checked here)
    idempotent: bool                  # a retry of the same request changes nothing more
    destructive: bool                 # it removes or stops something
    apply: object = None              # a served WRITE: (state, request, call) -> Mutation
    serve: object = None              # READ on the host, or served=False: (service, request, call) -> result
    check: object = None              # shape rules beyond the field spec, every front end
    admin_hint: str | None = None     # for ADMIN rows: the command that does it with sudo
    accepts_loss: bool = False        # WRITE: may commit over commits only the audit log has (recovery)
    rebinds: bool = False             # WRITE: changes the bound policy itself (skips the store's binding check)
    served: bool = True               # False: run in the caller's process, never a broker op
    explain: object = None            # (error, request, call) -> error: a refusal worded for the caller
    since: str = ROWS_SINCE           # the bk release whose nodes first serve this row (docs/CLUSTER.md)

    # Written out, not generated: the record's generated __init__ is compiled
    # on first use, and every command makes at least one row (~0.3 ms).
    def __init__(self, name, summary, request, fields, result, access, who, idempotent, destructive,
                 apply=None, serve=None, check=None, admin_hint=None, accepts_loss=False, rebinds=False,
                 served=True, explain=None, since=ROWS_SINCE):
        put = object.__setattr__
        put(self, "name", name)
        put(self, "summary", summary)
        put(self, "request", request)
        put(self, "fields", fields)
        put(self, "result", result)
        put(self, "access", access)
        put(self, "who", who)
        put(self, "idempotent", idempotent)
        put(self, "destructive", destructive)
        put(self, "apply", apply)
        put(self, "serve", serve)
        put(self, "check", check)
        put(self, "admin_hint", admin_hint)
        put(self, "accepts_loss", accepts_loss)
        put(self, "rebinds", rebinds)
        put(self, "served", served)
        put(self, "explain", explain)
        put(self, "since", since)

    def __getattribute__(self, name):
        # A "module:attr" value (see the module docstring) becomes the
        # object it names on first use, and stays so.
        value = object.__getattribute__(self, name)
        if type(value) is str and name in _LAZY:
            value = _resolve(value)
            object.__setattr__(self, name, value)
        return value

    def decode(self, wire: object):
        """The typed request from untrusted JSON, shape-checked."""
        from bk.service import fields

        self._wire()
        req = fields.decode(self.request, self.fields, {} if wire is None else wire)
        if self.check is not None:
            self.check(req)
        return req

    def validate(self, req) -> None:
        """The same checks as ``decode`` for a request built in this process:
        private mode (``LocalGateway``) and a broker client (``encode``) run
        it, so a request is refused, or not, wherever it is made."""
        from bk.service import fields

        self.check_type(req)
        self._wire()
        fields.check(req, self.fields)
        if self.check is not None:
            self.check(req)

    def _wire(self) -> None:
        if self.fields is None:
            raise InvalidInput(f"{self.name} runs only in the caller's own process: it has no fields a "
                               "program may send")

    def check_type(self, req) -> None:
        if type(req) is not self.request:
            raise InvalidInput(f"{self.name} takes a {self.request.__name__}, not {type(req).__name__}")

    def encode(self, req) -> dict:
        from bk.service import fields

        self.validate(req)
        return fields.encode(req)

    def schema(self, *, human: bool = False) -> dict:
        """The request's JSON Schema; ``human``: as a front end that takes a
        person's words (durations, starts) accepts it (``fields.Field.human``)."""
        from bk.service import fields

        self._wire()
        return fields.schema(self.request, self.fields, human=human)


def _row(name, summary, request, fields, result, access, who, *, idempotent, destructive, **kw):
    # A row as written; ``_Table`` makes it an ``Operation`` when first asked for.
    return name, (name, summary, request, fields, result, access, who, idempotent, destructive), kw


class _Table(dict):
    """Name -> ``Operation``, each made the first time it is asked for: a
    command runs one row or two of some sixty, and making them all on every
    start-up cost about 0.3 ms (``bk l`` is 10 ms over the interpreter)."""

    def __getitem__(self, name):
        value = dict.__getitem__(self, name)
        if type(value) is tuple:
            value = Operation(*value[0], **value[1])
            dict.__setitem__(self, name, value)
        return value

    def get(self, name, default=None):
        return self[name] if name in self else default

    def values(self):
        return [self[n] for n in self]

    def items(self):
        return [(n, self[n]) for n in self]


def _table() -> dict[str, Operation]:
    rows = (
        _row("book", "book GPUs, shared or exclusive, now or later", "requests:BookRequest",
             "fieldspecs:BOOK_FIELDS", "results:BookResult", WRITE, ANYONE,
             idempotent=False, destructive=False, apply="booking:apply_book",
             check="requests:check_request", explain="booking:explain_book"),
        _row("edit", "change one of your bookings", "requests:EditRequest",
             "fieldspecs:EDIT_FIELDS", "results:EditResult", WRITE, OWNER,
             idempotent=False, destructive=False, apply="booking:apply_edit",
             check="requests:check_request"),
        _row("cancel", "cancel a booking (another user's: the administrator, with a reason)",
             "requests:CancelRequest", "fieldspecs:CANCEL_FIELDS",
             "results:CancelResult", WRITE, OWNER, idempotent=True, destructive=True,
             apply="booking:apply_cancel"),
        # The worker's one write: the state of a job of the caller's own booking
        # (pending -> running -> an end), or bk j retry requeueing one.
        _row("job_state", "set the state of a job attached to one of your bookings",
             "requests:JobStateRequest", "fieldspecs:JOB_STATE_FIELDS",
             "jobs:JobResult", WRITE, OWNER, idempotent=True, destructive=False,
             apply="jobs:apply_job_state"),
        _row("notice_publish", "publish announcements", "requests:NoticeRequest",
             "fieldspecs:NOTICE_FIELDS", "results:NoticeResult", WRITE, ADMIN,
             idempotent=False, destructive=False, apply="notices:apply_publish",
             admin_hint="sudo bk admin notice publish TEXT"),
        _row("notice_archive", "archive notices", "requests:NoticeArchiveRequest",
             "fieldspecs:NOTICE_ARCHIVE_FIELDS", "results:NoticeResult", WRITE, ADMIN,
             idempotent=True, destructive=True, apply="notices:apply_archive",
             admin_hint="sudo bk admin notice archive ID"),
        _row("blackout_add",
             "open a maintenance window: announce it, block new bookings in it, keep or "
             "cancel the bookings already there",
             "requests:MaintainRequest", "fieldspecs:MAINTAIN_FIELDS",
             "results:MaintainResult", WRITE, ADMIN, idempotent=False, destructive=True,
             apply="maintenance:apply_maintain",
             check="maintenance:check_maintain", admin_hint="sudo bk admin maintain"),
        _row("blackout_end", "end a maintenance window now (or withdraw one not begun)",
             "requests:BlackoutEndRequest", "fieldspecs:BLACKOUT_END_FIELDS",
             "results:MaintainResult", WRITE, ADMIN, idempotent=True, destructive=True,
             apply="maintenance:apply_end", admin_hint="sudo bk admin maintain end ID"),
        _row("notice_edit", "change an announcement (the audit log keeps what it said)",
             "requests:NoticeEditRequest", "fieldspecs:NOTICE_EDIT_FIELDS",
             "results:NoticeEditResult", WRITE, ADMIN, idempotent=True, destructive=False,
             apply="maintenance:apply_notice_edit",
             check="maintenance:check_notice_edit",
             admin_hint="sudo bk admin notice edit ID --text ..."),
        _row("policy_bind", "bind the ledger to the policy the host's configuration now holds",
             "requests:PolicyBindRequest", "fieldspecs:POLICY_BIND_FIELDS",
             "results:PolicyBindResult", WRITE, ADMIN, idempotent=True, destructive=False,
             apply="policyedit:apply_bind", rebinds=True,
             admin_hint="sudo bk admin gpu-policy ..."),
        _row("data_lost", "show the commits the audit log records but the ledger lacks",
             "requests:Empty", (), "results:LostResult", READ, HOST,
             idempotent=True, destructive=False, serve="recovery:_serve_lost",
             admin_hint="sudo bk admin data recover --dry-run"),
        _row("data_recover", "accept (or replay) the commits the ledger lost",
             "requests:RecoverRequest", "fieldspecs:RECOVER_FIELDS",
             "results:LostResult", WRITE, HOST, idempotent=False, destructive=True,
             apply="recovery:apply_recover", admin_hint="sudo bk admin data recover",
             accepts_loss=True),
        _row("audit", "read the audit trail (your own; everyone's for the administrator)",
             "requests:AuditRequest", "fieldspecs:AUDIT_FIELDS",
             "results:AuditResult", READ, ANYONE, idempotent=True, destructive=False,
             serve="hostreads:_serve_audit"),
        _row("probe", "try the writes a commit needs, for real", "requests:Empty", (),
             "results:ProbeResult", READ, ANYONE, idempotent=True, destructive=False,
             serve="hostreads:_serve_probe"),
        _row("ping", "the broker's version and the caller as the kernel sees it", "requests:Empty",
             (), "results:PingResult", READ, ANYONE, idempotent=True, destructive=False,
             serve="hostreads:_serve_ping"),
        # An agent's session tag cleaned up (bk.agent's cleanup tool).
        _row("cleanup",
             "cancel your current and upcoming bookings made with an op-id prefix (or all of "
             "them), in one commit",
             "requests:CleanupRequest", "fieldspecs:CLEANUP_FIELDS",
             "results:CleanupResult", WRITE, OWNER, idempotent=True, destructive=True,
             apply="booking:apply_cleanup", check="booking:check_cleanup"),
        _row("context", "who you are, the rules, the GPUs and their live state, your bookings, the time",
             "requests:Empty", (), "status:ContextResult", READ, ANYONE,
             idempotent=True, destructive=False, serve="status:_serve_context",
             served=False),
        _row("status",
             "every GPU (use, memory, processes, live state, when next free), your bookings (or "
             "everyone's) and the notices",
             "status:StatusRequest", "fieldspecs:STATUS_FIELDS",
             "status:StatusView", READ, ANYONE, idempotent=True, destructive=False,
             serve="status:_serve_status", served=False),
        _row("timeline",
             "every GPU over a window of time: the share slots held in each step, yours apart, "
             "blackouts and disabled GPUs",
             "timeline:TimelineRequest", "fieldspecs:TIMELINE_FIELDS",
             "timeline:TimelineView", READ, ANYONE, idempotent=True, destructive=False,
             serve="timeline:_serve_timeline", served=False),
        _row("info", "who runs this server, its mode, data directory, GPUs and booking rules",
             "requests:Empty", (), "doctor:InfoResult", READ, ANYONE,
             idempotent=True, destructive=False, serve="doctor:_serve_info", served=False),
        _row("config", "every setting, its effective value and where it comes from",
             "requests:Empty", (), "doctor:ConfigResult", READ, ANYONE,
             idempotent=True, destructive=False, serve="doctor:_serve_config", served=False),
        _row("doctor", "check the installation (with probe: try what a booking needs, for real)",
             "doctor:DoctorRequest", "fieldspecs:DOCTOR_FIELDS",
             "doctor:DoctorResult", READ, ANYONE, idempotent=True, destructive=False,
             serve="doctor:_serve_doctor", served=False),
        _row("resolve", "which booking a list number, an ID prefix or an op-id names",
             "booking:ResolveRequest", "fieldspecs:RESOLVE_FIELDS",
             "booking:ResolveResult", READ, ANYONE, idempotent=True, destructive=False,
             serve="booking:_serve_resolve", served=False),
        _row("op_lookup", "what an op-id did here, and to which booking", "booking:OpLookupRequest",
             "fieldspecs:OP_LOOKUP_FIELDS", "booking:OpLookupResult", READ, ANYONE,
             idempotent=True, destructive=False, serve="booking:_serve_op_lookup",
             served=False),
        _row("history", "one booking's lifecycle: made, each edit, its cancellation",
             "history:HistoryRequest", "fieldspecs:HISTORY_FIELDS",
             "history:HistoryResult", READ, ANYONE, idempotent=True, destructive=False,
             serve="history:_serve_history", served=False),
        _row("screen",
             "one look for the full-screen timeline: the ledger, notices, the GPUs' live rows, the "
             "monitor and the worker",
             "status:ScreenRequest", None, "status:ScreenResult", READ, ANYONE,
             idempotent=True, destructive=False, serve="status:_serve_screen", served=False),
        _row("login", "the notices, and your bookings running now or starting within the hour",
             "status:LoginRequest", "fieldspecs:LOGIN_FIELDS",
             "status:LoginView", READ, ANYONE, idempotent=True, destructive=False,
             serve="status:_serve_login", served=False),
        _row("list", "your current and upcoming bookings, numbered (or everyone's, or your history)",
             "views:ListRequest", "fieldspecs:LIST_FIELDS",
             "views:ListResult", READ, ANYONE, idempotent=True, destructive=False,
             serve="views:_serve_list", served=False),
        _row("notices", "the announcements, and the notices addressed to you",
             "views:NoticesRequest", "fieldspecs:NOTICES_FIELDS",
             "views:NoticesResult", READ, ANYONE, idempotent=True, destructive=False,
             serve="views:_serve_notices", served=False),
        _row("recommend",
             "when and where GPUs are free: options, each with the command that books it " "(books nothing)",
             "advice:RecommendRequest", "fieldspecs:RECOMMEND_FIELDS",
             "advice:Recommendation", READ, ANYONE, idempotent=True, destructive=False,
             serve="advice:_serve_recommend", served=False,
             check="advice:check_recommend"),
        _row("gpu",
             "which GPUs to use now: those of your running booking, or GPUs free now (idle first) "
             "with their live state, or the earliest options",
             "advice:GpuRequest", "fieldspecs:GPU_FIELDS",
             "advice:GpuAdvice", READ, ANYONE, idempotent=True, destructive=False,
             serve="advice:_serve_gpu", served=False),
        _row("usage",
             "your GPU usage (booked, active, idle): today, 7 days, 4 weeks and your recent bookings "
             "(with since: your totals over that period too), or one booking's",
             "usage:UsageRequest", "fieldspecs:USAGE_FIELDS",
             "usage:UsageResult", READ, ANYONE, idempotent=True, destructive=False,
             serve="usage:_serve_usage", served=False),
        _row("usage_users",
             "everyone's booked, active, idle and unreserved GPU time over a period, per user and " "per GPU",
             "usage:SpanRequest", "fieldspecs:SPAN_FIELDS",
             "usage:UsersReport", READ, ANYONE, idempotent=True, destructive=False,
             serve="usage:_serve_users", served=False),
        _row("usage_samples", "the stored minute records of the usage history",
             "usage:SamplesRequest", "fieldspecs:SAMPLES_FIELDS",
             "usage:SamplesReport", READ, ANYONE, idempotent=True, destructive=False,
             serve="usage:_serve_samples", served=False),
        _row("usage_events", "unreserved use and idle bookings over a period",
             "usage:EventsRequest", "fieldspecs:EVENTS_FIELDS",
             "usage:EventsReport", READ, ANYONE, idempotent=True, destructive=False,
             serve="usage:_serve_events", served=False),
        _row("usage_verify", "check every sealed day of the usage history against its seal",
             "requests:Empty", (), "usage:VerifyReport", READ, ANYONE,
             idempotent=True, destructive=False, serve="usage:_serve_verify", served=False),
        _row("job_log", "the output of the command attached to one of your bookings",
             "jobs:JobLogRequest", "fieldspecs:JOB_LOG_FIELDS",
             "jobs:JobLogResult", READ, ANYONE, idempotent=True, destructive=False,
             serve="jobs:_serve_job_log", served=False),
        _row("jobs", "your scheduled commands: their state, why one waits, how it ended",
             "jobs:JobsRequest", "fieldspecs:JOBS_FIELDS",
             "jobs:JobsResult", READ, ANYONE, idempotent=True, destructive=False,
             serve="jobs:_serve_jobs", served=False),
        _row("job_retry", "run a job that ended (or is uncertain) again, while its booking lasts",
             "jobs:JobRetryRequest", "fieldspecs:JOB_RETRY_FIELDS",
             "jobs:JobResult", WRITE, OWNER, idempotent=False, destructive=False,
             serve="jobs:_serve_job_retry", served=False),
        _row("worker_status", "whether your scheduled-command worker runs, and your jobs waiting or running",
             "requests:Empty", (), "jobs:WorkerStatusResult", READ, ANYONE,
             idempotent=True, destructive=False, serve="jobs:_serve_worker_status",
             served=False),
        # Notifications (bk.service.notify): the caller's own private
        # settings, terminals and delivery log, never the broker's.  The
        # settings are the caller's own file, not the ledger: notify_set is a
        # local write (no transaction), as saving a preset is.
        _row("notify_show", "your notification settings, your terminals now, the deliverer and each "
             "channel's health", "requests:Empty", (), "notify:NotifyResult", READ, ANYONE,
             idempotent=True, destructive=False, serve="notify:serve_show", served=False),
        _row("notify_set", "change your notification settings (checked first: a bad address, URL or "
             "name is refused)", "notify:NotifySetRequest", "notify:SET_FIELDS",
             "notify:NotifyResult", WRITE, OWNER, idempotent=True, destructive=False,
             serve="notify:serve_set", check="notify:check_set", served=False),
        _row("notify_test", "send one test notification on each of your channels",
             "notify:NotifyTestRequest", "notify:TEST_FIELDS", "notify:NotifyResult", READ, ANYONE,
             idempotent=False, destructive=False, serve="notify:serve_test", check="notify:check_test",
             served=False),
        _row("notify_log", "the notifications delivered to you, newest first",
             "notify:NotifyLogRequest", "notify:LOG_FIELDS", "notify:NotifyResult", READ, ANYONE,
             idempotent=True, destructive=False, serve="notify:serve_log", check="notify:check_log",
             served=False),
        # bk export prom|ics|html; the monitor assembles the same record itself.
        _row("export", "the bookings, the GPUs' live state and today's use, for Prometheus, calendars "
             "and the web page of the week", "exports:ExportRequest", "exports:EXPORT_FIELDS",
             "exports:ExportResult", READ, ANYONE, idempotent=True, destructive=False,
             serve="exports:serve_export", check="exports:check_export", served=False),
        _row("export_page", "write a rendered page of the week into a directory of yours, atomically",
             "exports:PageRequest", None, "exports:PageWritten", WRITE, OWNER,
             idempotent=True, destructive=False, serve="exports:serve_page", served=False),
        _row("presets", "your private presets", "requests:Empty", (),
             "presets:PresetsResult", READ, ANYONE, idempotent=True, destructive=False,
             serve="presets:_serve_presets", served=False),
        _row("preset", "one of your presets and the booking it makes", "presets:PresetRequest",
             "fieldspecs:PRESET_FIELDS", "presets:PresetResult", READ, ANYONE,
             idempotent=True, destructive=False, serve="presets:_serve_preset",
             served=False),
        _row("preset_delete", "delete one of your presets", "presets:PresetDeleteRequest",
             "fieldspecs:PRESET_DELETE_FIELDS", "presets:PresetDeleteResult", WRITE,
             OWNER, idempotent=False, destructive=True,
             serve="presets:_serve_preset_delete", served=False),
        _row("defaults", "the guided booking's defaults, learned from your recent bookings",
             "requests:Empty", (), "presets:DefaultsResult", READ, ANYONE,
             idempotent=True, destructive=False, serve="presets:_serve_defaults",
             served=False),
        _row("prompt_history", "the interactive prompt's previous lines", "requests:Empty", (),
             "presets:PromptHistory", READ, ANYONE, idempotent=True, destructive=False,
             serve="presets:_serve_prompt_history", served=False),
        # The administrator's reads and the data directory as a whole (bk admin ...).
        _row("blackouts", "the maintenance windows now or ahead (or past ones too)",
             "maintenance:BlackoutsRequest", "fieldspecs:BLACKOUTS_FIELDS",
             "maintenance:BlackoutsResult", READ, ANYONE, idempotent=True,
             destructive=False, serve="maintenance:_serve_blackouts", served=False),
        _row("notice_list", "every announcement and notice, archived ones too, with its state",
             "requests:Empty", (), "maintenance:NoticeListResult", READ, ADMIN,
             idempotent=True, destructive=False, serve="maintenance:_serve_notice_list",
             served=False, admin_hint="sudo bk admin notice list"),
        _row("data_backup", "copy the data directory, with a checksummed manifest",
             "datacare:DataRequest", "fieldspecs:DATA_FIELDS",
             "datacare:DataResult", WRITE, HOST, idempotent=False, destructive=False,
             serve="datacare:_serve_backup", served=False,
             admin_hint="sudo bk admin data backup"),
        _row("data_verify", "check every file of a backup against its manifest",
             "datacare:DataRequest", "fieldspecs:DATA_FIELDS",
             "datacare:DataResult", READ, HOST, idempotent=True, destructive=False,
             serve="datacare:_serve_verify", served=False,
             admin_hint="sudo bk admin data verify DIR"),
        _row("data_clear", "back up, then empty the data directory (the services stopped)",
             "datacare:DataRequest", "fieldspecs:DATA_FIELDS",
             "datacare:DataResult", WRITE, HOST, idempotent=True, destructive=True,
             serve="datacare:_serve_clear", served=False,
             admin_hint="sudo bk admin data clear"),
        _row("data_restore", "restore a backup into an empty data directory (the services stopped)",
             "datacare:DataRequest", "fieldspecs:DATA_FIELDS",
             "datacare:DataResult", WRITE, HOST, idempotent=False, destructive=True,
             serve="datacare:_serve_restore", served=False,
             admin_hint="sudo bk admin data restore DIR"),
        # In-process rows: they take this process's environment or run a
        # program here, so they have no field spec and are never sent to a
        # broker.  book_job alone is served to a cluster client, since the
        # wire came (ROWS_SINCE): the node finishes its request from the
        # book row's fields, the command, and its own directory and PATH
        # (bk.cluster.serve, docs/CLUSTER.md).
        _row("book_job", "book GPUs with a command your worker starts at the booking's start",
             "jobs:BookJobRequest", None, "results:BookResult", WRITE, ANYONE,
             idempotent=False, destructive=False, serve="jobs:_serve_book_job",
             served=False, since=ROWS_SINCE),
        _row("worker_hint", "whether to say that no worker runs for you (once a login session)",
             "jobs:WorkerHintRequest", None, "jobs:WorkerHint", READ, ANYONE,
             idempotent=True, destructive=False, serve="jobs:_serve_worker_hint", served=False),
        _row("adopt", "the booking that puts a running process (or your processes on a GPU) under one, "
             "read from this machine's processes and GPUs (books nothing)",
             "adopt:AdoptRequest", None, "adopt:AdoptPlan", READ, ANYONE,
             idempotent=True, destructive=False, serve="adopt:_serve_adopt", served=False),
        _row("run_target", "the booking a command would run on now, and the environment it gets",
             "jobs:RunTargetRequest", None, "jobs:RunTarget", READ, ANYONE,
             idempotent=True, destructive=False, serve="jobs:_serve_run_target",
             served=False),
        _row("run_now", "run a command now, in the foreground, on one of your active bookings",
             "jobs:RunNowRequest", None, "jobs:RunNowResult", WRITE, OWNER,
             idempotent=False, destructive=False, serve="jobs:_serve_run_now", served=False),
        _row("worker", "run your scheduled-command worker in this process (until stopped, or once)",
             "jobs:WorkerRunRequest", None, "jobs:WorkerRunResult", WRITE, OWNER,
             idempotent=False, destructive=False, serve="jobs:_serve_worker_run",
             served=False),
        _row("preset_save", "save a booking under a name (replacing a preset of that name)",
             "presets:PresetSaveRequest", None, "presets:PresetSaveResult",
             WRITE, OWNER, idempotent=True, destructive=False,
             serve="presets:_serve_preset_save", served=False),
        _row("preset_hint", "after a booking: whether to suggest saving it as a preset",
             "presets:PresetHintRequest", None, "presets:PresetHint", READ,
             ANYONE, idempotent=True, destructive=False, serve="presets:_serve_preset_hint",
             served=False),
        _row("prompt_history_save", "keep the interactive prompt's lines",
             "presets:PromptHistoryRequest", None, "presets:PromptHistory",
             WRITE, OWNER, idempotent=True, destructive=False,
             serve="presets:_serve_prompt_history_save", served=False),
        _row("policy", "the GPU policy in force, the ledger's binding, and what a change would do",
             "policyedit:PolicyChange", None, "policyedit:PolicyView", READ,
             ADMIN, idempotent=True, destructive=False, serve="policyedit:_serve_policy",
             served=False, admin_hint="sudo bk admin gpu-policy"),
        _row("policy_write", "replace the configuration with a planned policy change, atomically",
             "policyedit:PolicyWriteRequest", None,
             "policyedit:PolicyWriteResult", WRITE, ADMIN, idempotent=True,
             destructive=False, serve="policyedit:_serve_policy_write", served=False,
             admin_hint="sudo bk admin gpu-policy ..."),
        _row("policy_rebind",
             "bind the ledger to the configuration: through the broker while one answers, else "
             "on the host as the service account",
             "requests:PolicyBindRequest", None, "results:PolicyBindResult",
             WRITE, ADMIN, idempotent=True, destructive=False,
             serve="policyedit:_serve_rebind", served=False,
             admin_hint="sudo bk admin gpu-policy ..."),
    )
    return _Table((name, (args, kw)) for name, args, kw in rows)


OPERATIONS: dict[str, Operation] = _table()


def served(name: str) -> Operation:
    """The row the broker serves for ``name``: local rows are unknown there."""
    op = OPERATIONS.get(name) if isinstance(name, str) else None
    if op is None or not op.served:
        raise InvalidInput(f"unknown operation {str(name)[:40]!r}",
                           hint="operations: " + ", ".join(n for n, o in OPERATIONS.items() if o.served))
    return op


def get(name: str) -> Operation:
    op = OPERATIONS.get(name) if isinstance(name, str) else None
    if op is None:
        raise InvalidInput(f"unknown operation {str(name)[:40]!r}", hint="operations: " + ", ".join(OPERATIONS))
    return op


def writes() -> list[Operation]:
    return [op for op in OPERATIONS.values() if op.access == WRITE]


# ------------------------------------------------------------ the face's names
#
# The request and result types of the rows, by name: ``from bk.service
# import ListRequest``.  Each is imported from its module when first asked
# for (PEP 562), so naming one costs only the module of its row.

_TYPES = {
    "views": ("ListRequest", "ListResult", "NoticesRequest", "NoticesResult"),
    "advice": ("RecommendRequest", "Recommendation", "GpuRequest", "GpuAdvice", "describe"),
    "timeline": ("TimelineRequest", "TimelineView"),
    "doctor": ("InfoResult", "ConfigResult", "DoctorRequest", "DoctorResult"),
    "booking": ("ResolveRequest", "ResolveResult", "OpLookupRequest", "OpLookupResult"),
    "history": ("HistoryRequest", "HistoryResult"),
    "usage": ("UsageRequest", "UsageResult", "SpanRequest", "SamplesRequest", "EventsRequest", "Dashboard",
              "UsersReport", "SamplesReport", "EventsReport", "VerifyReport"),
    "jobs": ("JobResult", "JobsRequest", "JobsResult", "JobLogRequest", "JobLogResult", "JobRetryRequest",
             "WorkerStatusResult", "WorkerRunRequest", "WorkerRunResult", "BookJobRequest", "RunTargetRequest",
             "RunTarget", "RunNowRequest", "RunNowResult", "WorkerHintRequest", "WorkerHint", "NO_WORKER"),
    "notify": ("NotifySetRequest", "NotifyTestRequest", "NotifyLogRequest", "NotifyResult"),
    "adopt": ("AdoptRequest", "AdoptPlan"),
    "exports": ("ExportRequest", "ExportResult", "PageRequest", "PageWritten"),
    "presets": ("Preset", "PresetsResult", "PresetRequest", "PresetResult", "PresetSaveRequest",
                "PresetSaveResult", "PresetDeleteRequest", "PresetDeleteResult", "DefaultsResult",
                "PresetHintRequest", "PresetHint", "PromptHistory", "PromptHistoryRequest"),
    "maintenance": ("BlackoutsRequest", "BlackoutsResult", "NoticeListResult"),
    "datacare": ("DataRequest", "DataResult"),
    "policyedit": ("PolicyChange", "PolicyView", "PolicyWriteRequest", "PolicyWriteResult"),
    "status": ("StatusRequest", "StatusView", "LoginRequest", "LoginView", "ContextResult", "ScreenRequest",
               "ScreenResult", "GpuRow"),
    "telemetry": ("Fixed",),
    "requests": ("BookRequest", "EditRequest", "CancelRequest", "NoticeRequest", "NoticeArchiveRequest",
                 "AuditRequest", "JobStateRequest", "Empty", "RecoverRequest", "MaintainRequest",
                 "BlackoutEndRequest", "NoticeEditRequest", "PolicyBindRequest", "CleanupRequest"),
    "results": ("BookResult", "EditResult", "CancelResult", "NoticeResult", "AuditResult", "ProbeResult",
                "PingResult", "LostResult", "MaintainResult", "NoticeEditResult", "PolicyBindResult",
                "CleanupResult"),
    "context": ("Actor", "Call"),
}
_WHERE = {name: module for module, names in _TYPES.items() for name in names}


def __getattr__(name: str):
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'bk.service' has no attribute {name!r}")
    value = _resolve(f"{module}:{name}")
    globals()[name] = value
    return value


# ------------------------------------------------------------ the service

def open_app(env: dict, *, actor=None, clock_fn=None, backend=None, telemetry=None, connect=None):
    """The service for this process.  Tests and embedding front ends may
    inject the actor, the clock, the GPU backend (or the whole telemetry,
    e.g. ``telemetry.Fixed`` with a snapshot) and the broker connection.
    The clock (``BK_NOW``) and the zone (``TZ``) are ``env``'s, like every
    other setting, never this process's ``os.environ``: an in-process front
    end and the command it stands for cannot disagree."""
    from bk import clock
    from bk.service.app import Service
    from bk.service.telemetry import Telemetry
    from bk.store.config import load
    from bk.store.paths import locate

    where = locate(env)
    settings = load(where)
    clock_fn = clock_fn or clock.clock_of(env)

    def tz_fn():
        return clock.zone_of(env).tz

    def open_backend():
        if backend is not None:
            return backend
        from bk.gpu import open_backend as open_

        return open_(env, settings["gpu_count"], simulated=settings["simulated_gpus"])

    if telemetry is None:
        telemetry = Telemetry(open_backend, clock=clock_fn, cache_dir=where.cache_dir, monitor=settings)
    if settings.mode == "shared":
        return Service.remote(settings, telemetry, actor=actor, clock_fn=clock_fn, connect=connect, tz_fn=tz_fn)
    return Service.local(settings, telemetry, actor=actor, clock_fn=clock_fn, tz_fn=tz_fn)


def open_host(env: dict, settings, *, service_uid: int, telemetry=None):
    """The broker's service: operations run on the shared ledger as the
    service account.  Its telemetry has no inventory cache: the broker lives
    for months and asks the backend itself, off the request path."""
    from bk import clock
    from bk.service.app import Service, user_name
    from bk.service.context import Actor
    from bk.service.telemetry import Telemetry

    if telemetry is None:
        def open_backend():
            from bk.gpu import open_backend as open_

            return open_(env, settings["gpu_count"], simulated=settings["simulated_gpus"])
        # The refresher reads the monitor's snapshot while it is fresh
        # (``Telemetry.snapshot``), so the broker asks the GPUs itself only
        # when no monitor runs.
        telemetry = Telemetry(open_backend, clock=clock.now, monitor=settings)
    actor = Actor(service_uid, user_name(service_uid))
    return Service.local(settings, telemetry, actor=actor, owner_uid=service_uid, clock_fn=clock.now)


__all__ = ["ADMIN", "ANYONE", "HOST", "OPERATIONS", "OWNER", "READ", "ROWS_SINCE", "WRITE", "Operation", "get",
           "open_app", "open_host", "served", "version_tuple", "writes", *_WHERE]
