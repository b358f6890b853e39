"""The operation table: every operation a caller can ask of a bk host, once.

A row names the request type and its field spec, the result type, whether
it reads or writes, who may call it, and whether a retry is harmless or it
destroys something.  Everything else is derived from this table:

* the broker's allowlist and decoder (``bk.broker.handlers``: an op not in
  the table, or not ``served``, is refused before any code runs);
* the client side (``bk.service.gateway.BrokerGateway``: encode the request
  with the spec, rebuild the result with the result type);
* the local side (``LocalGateway``: run ``apply`` in one transaction, or
  ``serve`` for a read only the host may make);
* the agent surface (``bk.service.agent``: ``bk mcp`` tools, ``bk agent``):
  input schemas from ``schema``, hints from access/destructive/idempotent.

A read row with ``served=False`` is never a broker operation: anyone may
make it from the committed ledger or their own files, so every caller runs
its ``serve`` in its own process (``agent.perform``); ``served()`` is the
broker's allowlist.

Adding a write is one apply function plus one row.

A row may name its request, field spec, result or functions as
``"module:attr"``: the module is imported when the row's value is first
used, so a booking does not load the agent surface or the jobs module
(~0.9 ms) just to build the table.
"""

from __future__ import annotations

from collections.abc import Callable

from bk.core.errors import InvalidInput
from bk.core.record import dataclass
from bk.service import booking, fields, notices, requests, results, specs
from bk.service.requests import (
    AuditRequest,
    BookRequest,
    CancelRequest,
    EditRequest,
    Empty,
    NoticeArchiveRequest,
    NoticeRequest,
)

READ, WRITE = "read", "write"
ANYONE, OWNER, ADMIN = "anyone", "owner", "admin"
HOST = "host"       # whoever owns the data: you in private mode, root on a shared server

_LAZY = frozenset({"request", "fields", "result", "apply", "serve", "check"})


def _resolve(ref: str):
    module, _, attr = ref.partition(":")
    return getattr(__import__(module, fromlist=(attr,)), attr)


@dataclass(frozen=True)
class Operation:
    name: str
    summary: str                      # "book GPUs"; also the MCP tool description's first line
    request: type                     # each of these six may be "module:attr" (module docstring)
    fields: tuple
    result: type
    access: str                       # READ | WRITE
    who: str                          # ANYONE | OWNER (the apply checks ownership) | ADMIN | HOST (checked here)
    idempotent: bool                  # a retry of the same request changes nothing more
    destructive: bool                 # it removes or stops something
    apply: Callable | None = None     # WRITE: (state, request, call) -> Mutation
    serve: Callable | None = None     # READ: (service, request, call) -> result, on the host (or served=False: here)
    check: Callable | None = None     # shape rules beyond the field spec, every front end
    admin_hint: str | None = None     # for ADMIN rows: the command that does it with sudo
    accepts_loss: bool = False        # WRITE: may commit over commits only the audit log has (recovery)
    rebinds: bool = False             # WRITE: changes the bound policy itself (skips the store's binding check)
    served: bool = True               # False: a local read, never a broker op (each caller serves it)

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
        req = fields.decode(self.request, self.fields, {} if wire is None else wire)
        if self.check is not None:
            self.check(req)
        return req

    def validate(self, req) -> None:
        """The same checks as ``decode`` for a request built in this process:
        private mode (``LocalGateway``) and a broker client (``encode``) run
        it, so a request is refused, or not, wherever it is made."""
        if type(req) is not self.request:
            raise InvalidInput(f"{self.name} takes a {self.request.__name__}, not {type(req).__name__}")
        fields.check(req, self.fields)
        if self.check is not None:
            self.check(req)

    def encode(self, req) -> dict:
        self.validate(req)
        return fields.encode(req)

    def schema(self) -> dict:
        return fields.schema(self.request, self.fields)


# -------------------------------------------------------- host-side reads

def _serve_audit(service, req: AuditRequest, call) -> results.AuditResult:
    return service.local_audit(req, call)


def _serve_probe(service, req: Empty, call) -> results.ProbeResult:
    return results.ProbeResult(tuple(service.local_probe()))


def _serve_ping(service, req: Empty, call) -> results.PingResult:
    import os

    from bk import __version__

    actor = call.actor
    return results.PingResult({"version": __version__, "pid": os.getpid(), "uid": os.geteuid()},
                              {"pid": call.peer_pid, "uid": actor.uid, "user": actor.user,
                               "admin": actor.is_admin})


def _apply_job_state(state, req, call):
    from bk.service import jobs

    return jobs.apply_job_state(state, req, call)


# Recovery is rare: its module loads only when one of its rows runs.
def _serve_lost(service, req, call):
    from bk.service import recovery

    return recovery.serve_lost(service, req, call)


def _apply_recover(state, req, call, *, lost):
    from bk.service import recovery

    return recovery.apply_recover(state, req, call, lost=lost)


# The administrator's maintenance windows, notice edits and policy binding
# (bk.service.maintenance, bk.service.policyedit) load when a row runs.
def _apply_maintain(state, req, call):
    from bk.service import maintenance

    return maintenance.apply_maintain(state, req, call)


def _apply_blackout_end(state, req, call):
    from bk.service import maintenance

    return maintenance.apply_end(state, req, call)


def _apply_notice_edit(state, req, call):
    from bk.service import maintenance

    return maintenance.apply_notice_edit(state, req, call)


def _apply_bind(state, req, call):
    from bk.service import policyedit

    return policyedit.apply_bind(state, req, call)


def _check_maintain(req):
    from bk.service import maintenance

    maintenance.check_maintain(req)


def _check_notice_edit(req):
    from bk.service import maintenance

    maintenance.check_notice_edit(req)


def _serve_agent(name: str):
    def serve(service, req, call):
        from bk.service import agent

        return getattr(agent, f"serve_{name}")(service, req, call)
    serve.__name__ = f"serve_{name}"
    return serve


def _serve_notify(name: str):
    def serve(service, req, call):
        from bk.service import notify

        return notify.serve(name)(service, req, call)
    serve.__name__ = f"serve_notify_{name}"
    return serve


def _check_recommend(req):
    from bk.service.requests import BookRequest, check_request

    check_request(BookRequest(req.count, req.duration, mode=req.mode, share=req.share, mem_mib=req.mem_mib,
                              start=req.start, pinned=req.pinned, excluded=req.excluded))


OPERATIONS: dict[str, Operation] = {op.name: op for op in (
    Operation("book", "book GPUs, shared or exclusive, now or later", BookRequest, specs.BOOK_FIELDS,
              results.BookResult, WRITE, ANYONE, idempotent=False, destructive=False,
              apply=booking.apply_book, check=requests.check_request),
    Operation("edit", "change one of your bookings", EditRequest, specs.EDIT_FIELDS,
              results.EditResult, WRITE, OWNER, idempotent=False, destructive=False,
              apply=booking.apply_edit, check=requests.check_request),
    Operation("cancel", "cancel a booking (another user's: the administrator, with a reason)",
              CancelRequest, specs.CANCEL_FIELDS, results.CancelResult, WRITE, OWNER,
              idempotent=True, destructive=True, apply=booking.apply_cancel),
    # The worker's one write: the state of a job of the caller's own booking
    # (pending -> running -> an end), or bk j retry requeueing one.
    Operation("job_state", "set the state of a job attached to one of your bookings",
              requests.JobStateRequest, specs.JOB_STATE_FIELDS, "bk.service.jobs:JobResult", WRITE, OWNER,
              idempotent=True, destructive=False, apply=_apply_job_state),
    Operation("notice_publish", "publish announcements", NoticeRequest, specs.NOTICE_FIELDS,
              results.NoticeResult, WRITE, ADMIN, idempotent=False, destructive=False,
              apply=notices.apply_publish, admin_hint="sudo bk admin notice publish TEXT"),
    Operation("notice_archive", "archive notices", NoticeArchiveRequest, specs.NOTICE_ARCHIVE_FIELDS,
              results.NoticeResult, WRITE, ADMIN, idempotent=True, destructive=True,
              apply=notices.apply_archive, admin_hint="sudo bk admin notice archive ID"),
    Operation("blackout_add", "open a maintenance window: announce it, block new bookings in it, keep or "
              "cancel the bookings already there", requests.MaintainRequest, specs.MAINTAIN_FIELDS,
              results.MaintainResult, WRITE, ADMIN, idempotent=False, destructive=True,
              apply=_apply_maintain, check=_check_maintain, admin_hint="sudo bk admin maintain"),
    Operation("blackout_end", "end a maintenance window now (or withdraw one not begun)",
              requests.BlackoutEndRequest, specs.BLACKOUT_END_FIELDS, results.MaintainResult, WRITE, ADMIN,
              idempotent=True, destructive=True, apply=_apply_blackout_end,
              admin_hint="sudo bk admin maintain end ID"),
    Operation("notice_edit", "change an announcement (the audit log keeps what it said)",
              requests.NoticeEditRequest, specs.NOTICE_EDIT_FIELDS, results.NoticeEditResult, WRITE, ADMIN,
              idempotent=True, destructive=False, apply=_apply_notice_edit, check=_check_notice_edit,
              admin_hint="sudo bk admin notice edit ID --text ..."),
    Operation("policy_bind", "bind the ledger to the policy the host's configuration now holds",
              requests.PolicyBindRequest, specs.POLICY_BIND_FIELDS, results.PolicyBindResult, WRITE, ADMIN,
              idempotent=True, destructive=False, apply=_apply_bind, rebinds=True,
              admin_hint="sudo bk admin gpu-policy ..."),
    Operation("data_lost", "show the commits the audit log records but the ledger lacks", Empty, (),
              results.LostResult, READ, HOST, idempotent=True, destructive=False,
              serve=_serve_lost, admin_hint="sudo bk admin data recover --dry-run"),
    Operation("data_recover", "accept (or replay) the commits the ledger lost", requests.RecoverRequest,
              specs.RECOVER_FIELDS, results.LostResult, WRITE, HOST, idempotent=False, destructive=True,
              apply=_apply_recover, admin_hint="sudo bk admin data recover", accepts_loss=True),
    Operation("audit", "read the audit trail (your own; everyone's for the administrator)",
              AuditRequest, specs.AUDIT_FIELDS, results.AuditResult, READ, ANYONE,
              idempotent=True, destructive=False, serve=_serve_audit),
    Operation("probe", "try the writes a commit needs, for real", Empty, (), results.ProbeResult,
              READ, ANYONE, idempotent=True, destructive=False, serve=_serve_probe),
    Operation("ping", "the broker's version and the caller as the kernel sees it", Empty, (),
              results.PingResult, READ, ANYONE, idempotent=True, destructive=False, serve=_serve_ping),
    # The agent's writes and local reads (bk.service.agent): bk mcp tools and bk agent.
    Operation("cleanup", "cancel your current and upcoming bookings made with an op-id prefix (or all of "
              "them), in one commit", "bk.service.agent:CleanupRequest", "bk.service.agent:CLEANUP_FIELDS",
              "bk.service.agent:CleanupResult", WRITE, OWNER, idempotent=True, destructive=True,
              apply="bk.service.agent:apply_cleanup", check="bk.service.agent:check_cleanup"),
    Operation("context", "who you are, the rules, the GPUs and their live state, your bookings, the time",
              Empty, (), "bk.service.agent:Data", READ, ANYONE, idempotent=True, destructive=False,
              serve=_serve_agent("context"), served=False),
    Operation("list", "your current and upcoming bookings, numbered (or everyone's, or your history)",
              "bk.service.agent:ListRequest", "bk.service.agent:LIST_FIELDS", "bk.service.agent:Data", READ, ANYONE, idempotent=True,
              destructive=False, serve=_serve_agent("list"), served=False),
    Operation("recommend", "when and where GPUs are free: options, each with the command that books it "
              "(books nothing)", "bk.service.agent:RecommendRequest", "bk.service.agent:RECOMMEND_FIELDS",
              "bk.service.agent:Data", READ, ANYONE,
              idempotent=True, destructive=False, serve=_serve_agent("recommend"), served=False,
              check=_check_recommend),
    Operation("usage", "your GPU usage (booked, active, idle), or one booking's", "bk.service.agent:UsageRequest",
              "bk.service.agent:USAGE_FIELDS", "bk.service.agent:Data", READ, ANYONE, idempotent=True, destructive=False,
              serve=_serve_agent("usage"), served=False),
    # Notifications (bk.service.notify): the caller's own private settings,
    # terminals and delivery log, so local rows that never reach the broker.
    # The settings file is not the ledger: notify_set is a local row like the
    # others (no transaction), and it changes nothing of anybody else's.
    Operation("notify_show", "your notification settings, your terminals now, the deliverer and each "
              "channel's health", Empty, (), "bk.service.notify:NotifyResult", READ, ANYONE,
              idempotent=True, destructive=False, serve=_serve_notify("show"), served=False),
    Operation("notify_set", "change your notification settings (checked first: a bad address, URL or "
              "name is refused)", "bk.service.notify:NotifySetRequest", "bk.service.notify:SET_FIELDS",
              "bk.service.notify:NotifyResult", READ, ANYONE, idempotent=True, destructive=False,
              serve=_serve_notify("set"), check="bk.service.notify:check_set", served=False),
    Operation("notify_test", "send one test notification on each of your channels", "bk.service.notify:"
              "NotifyTestRequest", "bk.service.notify:TEST_FIELDS", "bk.service.notify:NotifyResult", READ,
              ANYONE, idempotent=False, destructive=False, serve=_serve_notify("test"), served=False),
    Operation("notify_log", "the notifications delivered to you, newest first", "bk.service.notify:"
              "NotifyLogRequest", "bk.service.notify:LOG_FIELDS", "bk.service.notify:NotifyResult", READ,
              ANYONE, idempotent=True, destructive=False, serve=_serve_notify("log"), served=False),
    Operation("job_log", "the output of the command attached to one of your bookings",
              "bk.service.agent:JobLogRequest", "bk.service.agent:JOB_LOG_FIELDS", "bk.service.agent:Data", READ, ANYONE, idempotent=True, destructive=False,
              serve=_serve_agent("job_log"), served=False),
    # bk export prom|ics|html (bk.service.exports); the monitor assembles the same record itself.
    Operation("export", "the bookings, the GPUs' live state and today's use, for Prometheus, calendars and "
              "the web page of the week", "bk.service.exports:ExportRequest", "bk.service.exports:EXPORT_FIELDS",
              "bk.service.exports:ExportResult", READ, ANYONE, idempotent=True, destructive=False,
              serve="bk.service.exports:serve_export", served=False),
)}


def served(name: str) -> Operation:
    """The row the broker serves for ``name``: local reads are unknown there."""
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
