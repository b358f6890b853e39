"""The field spec of each request type (``bk.service.fields``), named by
the operation table.  Apart from ``requests`` so that a command that only
reads (``bk l``) never loads them."""

from __future__ import annotations

from bk.core.models import MODES
from bk.service.fields import Field

MAX_NOTE = 1000
MAX_NOTICE_TEXT = 2000
MAX_AUDIT_LIMIT = 1000
MAX_OP_ID = 128
# An op-id is a key a script picks ("retry-7", a job id, a UUID): shown in
# bk lg and matched byte for byte, so a narrow alphabet with no look-alikes.
OP_ID = "[A-Za-z0-9._:-]+"
OP_ID_HELP = f"1-{MAX_OP_ID} characters of A-Z a-z 0-9 . _ : -"
RESERVATION_ID = "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"

_WRITE = (Field("op_id", "text", min_len=1, max_len=MAX_OP_ID, pattern=OP_ID,
                help="idempotency key: a retry with it changes nothing; " + OP_ID_HELP),
          Field("dry_run", "bool", help="show what would happen; change nothing"))
_PLACE = (Field("mode", "choice", choices=MODES), Field("share", "int", lo=1, hi=64),
          Field("mem_mib", "int", lo=1, help="VRAM per GPU in MiB", human="memory"),
          Field("start", "int", help="start, epoch seconds (UTC)", human="start"),
          Field("queue", "bool", help="take the earliest start at or after the one asked for"),
          Field("pinned", "gpus", help="exactly these GPUs"),
          Field("excluded", "gpus", help="never these GPUs"),
          Field("note", "text", max_len=MAX_NOTE))

JOB_ID = "[0-9a-f]{32}"
JOB_STATES = ("pending", "running", "succeeded", "failed", "cancelled", "missed", "timed-out",
              "uncertain")         # bk.core.jobs.STATES (not imported: bk l loads this module)
_JOB = (Field("job_id", "text", max_len=32, pattern=JOB_ID, help="the private job spec's ID"),
        Field("job_digest", "text", max_len=64, pattern="[0-9a-f]{64}",
              help="sha256 of the private job spec: the booking runs only that spec"),
        Field("job_summary", "text", max_len=48, pattern="[A-Za-z0-9._+ -]+",
              help="what others may see of the command: its program name and argument count"))
# Issue 27: bookings that move earlier, and shared with others (bk.core.advance, bk.core.sharing).
SHARED_WITH = "[A-Za-z0-9._$@, -]*"
_FAIR = (Field("advance", "bool", help="if queued, move to an earlier start on its own when GPUs free up"),
         Field("no_advance", "bool", help="never move on its own (overrides the server's advance_default)"),
         Field("shared_with", "text", max_len=2200, pattern=SHARED_WITH,
               help="users and @groups who may also use it, comma-separated; none: nobody"))
IDLE_RELEASE_MAX = 10080          # a week, in minutes (idle_release_minutes' bound)
ADOPT = "[0-9]{1,10}:[0-9]{1,20}(,[0-9]{1,10}:[0-9]{1,20}){0,63}"
_IDLE = Field("idle_release_minutes", "int", lo=5, hi=IDLE_RELEASE_MAX,
              help="end the booking once it was seen idle this many minutes (opt-in; bk u samples shows why)")
BOOK_FIELDS = (Field("count", "int", lo=1, hi=64, help="number of GPUs"),
               Field("duration", "int", lo=1, help="seconds", human="duration"), *_PLACE, *_WRITE,
               Field("again", "bool", help="book even if the same booking was made a few minutes ago "
                     "(without it, that repeat answers exists with the first booking)"), *_JOB, _IDLE,
               Field("adopt", "text", max_len=2000, pattern=ADOPT,
                     help="bk adopt: the running processes the booking follows, PID:START_TICKS,... "
                     "(it ends when they have all exited)"), *_FAIR)
JOB_STATE_FIELDS = (Field("ref", "text", max_len=36, pattern=RESERVATION_ID, help="the reservation's full ID"),
                    Field("job_id", "text", max_len=32, pattern=JOB_ID),
                    Field("status", "choice", choices=JOB_STATES),
                    Field("reason", "text", max_len=500, help="why it waits or ended, for bk j"),
                    Field("exit_code", "int", lo=0, hi=255),
                    Field("retry", "bool", help="requeue a job that ended (only while its booking lasts)"))
EDIT_FIELDS = (Field("ref", "text", max_len=64, help="the reservation's full ID"),
               Field("duration", "int", lo=1, help="new total length, seconds", human="length"),
               Field("end", "int", help="new end, epoch seconds", human="end"),
               Field("clear_mem", "bool", help="forget the memory figure"), *_PLACE, *_WRITE,
               Field("idle_release_minutes", "int", lo=0, hi=IDLE_RELEASE_MAX,
                     help="end it once seen idle this many minutes; 0: off"),
               Field("keep_until", "int", lo=0, help="keep it (no idle nudge, no idle release) until "
                     "then, epoch seconds; 0: stop keeping"), *_FAIR)
CANCEL_FIELDS = (Field("ref", "text", max_len=64, help="the reservation's full ID"),
                 Field("reason", "text", max_len=MAX_NOTE, help="required to cancel another user's"),
                 *_WRITE)
NOTICE_FIELDS = (Field("text", "text", max_len=MAX_NOTICE_TEXT),
                 Field("level", "choice", choices=("info", "warning", "critical")),
                 Field("until", "int", help="withdrawn at, epoch seconds"),
                 Field("start", "int", help="shown from, epoch seconds (default: now)"), _WRITE[1])
NOTICE_ARCHIVE_FIELDS = (Field("ref", "text", max_len=36, pattern="[0-9a-f-]{4,36}",
                               help="a notice ID or a prefix of at least 4 characters"), _WRITE[1])
AUDIT_FIELDS = (Field("limit", "int", lo=1, hi=MAX_AUDIT_LIMIT),
                Field("all", "bool", help="everyone's (the administrator only)"),
                Field("reservation", "text", pattern=RESERVATION_ID, help="a full reservation ID"))
RECOVER_FIELDS = (Field("ledger_seq", "int", help="the commit the ledger reads at"),
                  Field("audit_seq", "int", help="the newest commit the audit log records"),
                  Field("replay", "bool", help="rebuild the lost bookings from the audit records"),
                  _WRITE[1])

# Administrator's maintenance windows and notice edits (bk.service.maintenance).
_IDS = f"{RESERVATION_ID}(,{RESERVATION_ID})*"
MAINTAIN_FIELDS = (Field("start", "int", help="window start, epoch seconds"),
                   Field("end", "int", help="window end, epoch seconds"),
                   Field("reason", "text", min_len=1, max_len=MAX_NOTE, help="shown to every user"),
                   Field("level", "choice", choices=("info", "warning", "critical")),
                   Field("block", "bool", help="refuse new bookings in the window (a blackout)"),
                   Field("overlapping", "choice", choices=("refuse", "keep", "cancel"),
                         help="what to do with the bookings already in the window"),
                   Field("seen", "text", max_len=37 * 1000, pattern=_IDS,
                         help="the overlapping bookings the administrator was shown, comma-separated"),
                   Field("text", "text", max_len=MAX_NOTICE_TEXT, help="the announcement (default: the reason)"),
                   _WRITE[1])
BLACKOUT_END_FIELDS = (Field("ref", "text", max_len=36, pattern="[0-9a-f-]{4,36}",
                             help="a window's ID or a prefix of at least 4 characters"), _WRITE[1])
NOTICE_EDIT_FIELDS = (NOTICE_ARCHIVE_FIELDS[0], Field("text", "text", max_len=MAX_NOTICE_TEXT),
                      Field("level", "choice", choices=("info", "warning", "critical")),
                      Field("until", "int", help="withdrawn at, epoch seconds"),
                      Field("clear_until", "bool", help="shown until archived"), _WRITE[1])
POLICY_BIND_FIELDS = (Field("gpu_count", "int", lo=1, hi=64), Field("slot_minutes", "int", lo=1, hi=60),
                      Field("max_shared_users", "int", lo=1, hi=64),
                      Field("shared_memory_reserve_mb", "int", lo=0, hi=1 << 20),
                      Field("require_shared_memory", "bool"),
                      Field("force", "bool", help="keep bookings the new policy would refuse"), _WRITE[1])


# The reads every front end makes (local rows: bk.service.views, status, ...).
LIST_FIELDS = (Field("scope", "choice", choices=("mine", "all", "history"),
                     help="mine: your current and upcoming (default); all: everyone's; history: your ended"),
               Field("limit", "int", lo=1, hi=10000, help="at most this many"))
NOTICES_FIELDS = (Field("all", "bool", help="archived and expired notices too"),)
STATUS_FIELDS = (Field("verbose", "bool", help="everyone's bookings, and the processes"),)
LOGIN_FIELDS = (Field("lookahead", "int", lo=0, hi=7 * 86400, help="bookings starting within this many seconds"),)
RECOMMEND_FIELDS = (Field("count", "int", lo=1, hi=64, help="number of GPUs"),
                    Field("duration", "int", lo=1, help="seconds", human="duration"),
                    Field("mode", "choice", choices=MODES), Field("share", "int", lo=1, hi=64),
                    Field("mem_mib", "int", lo=1, help="VRAM per GPU in MiB", human="memory"),
                    Field("start", "int", help="earliest start, epoch seconds (UTC); default now", human="start"),
                    Field("pinned", "gpus", help="exactly these GPUs"),
                    Field("excluded", "gpus", help="never these GPUs"),
                    Field("limit", "int", lo=1, hi=20, help="how many options (default 3)"))
GPU_FIELDS = (Field("count", "int", lo=1, hi=64, help="GPUs to look for (default: your running booking's, "
                    "else one)"),
              Field("duration", "int", lo=1, help="for how long, seconds (default 3600)", human="duration"),
              Field("mode", "choice", choices=MODES), Field("share", "int", lo=1, hi=64),
              Field("mem_mib", "int", lo=1, help="VRAM per GPU in MiB", human="memory"),
              Field("pinned", "gpus", help="exactly these GPUs"),
              Field("excluded", "gpus", help="never these GPUs"))
TIMELINE_FIELDS = (Field("width", "int", lo=12, hi=100000, help="characters across, the GPU labels included"),
                   Field("frm", "int", help="the first time shown, epoch seconds (default: just before now)"),
                   Field("window", "int", lo=1, help="seconds shown (default: what fits)"),
                   Field("step", "int", lo=60, help="seconds per column (default: the finest that fits)"),
                   Field("gpus", "gpus", help="only these GPUs"),
                   Field("fit", "bool", help="refuse more columns than fit the width"))
DOCTOR_FIELDS = (Field("probe", "bool", help="also try the broker round trip, an atomic replace and the lock"),
                 Field("strict", "bool", help="warnings count as failures"),
                 Field("require_monitor", "bool", help="fail unless the GPU monitor runs"),
                 Field("require_worker", "bool", help="fail unless your scheduled-command worker runs"))
RESOLVE_FIELDS = (Field("ref", "text", min_len=1, max_len=64, help="a list number, an ID prefix, or a full ID"),
                  Field("op_id", "text", min_len=1, max_len=MAX_OP_ID, pattern=OP_ID,
                        help="the op-id of an earlier request: the booking it changed, if any"),
                  Field("action", "choice", choices=("book", "edit", "cancel"), help="what that op-id did"),
                  Field("any_owner", "bool", help="anyone's booking (the administrator)"))
OP_LOOKUP_FIELDS = (Field("op_id", "text", min_len=1, max_len=MAX_OP_ID, pattern=OP_ID),)
HISTORY_FIELDS = (Field("ref", "text", min_len=1, max_len=64, help="a list number, an ID prefix, or a full ID"),)
USAGE_FIELDS = (Field("reservation", "text", max_len=36, pattern=RESERVATION_ID,
                      help="one booking's booked and active seconds; default: your dashboard"),
                Field("since", "int", help="also your totals from then, epoch seconds", human="since"),
                Field("until", "int", help="with since: the end of that period (default now)", human="since"))
_SPAN = (Field("since", "int", help="start of the period, epoch seconds"),
         Field("until", "int", help="end of the period, epoch seconds"))
SPAN_FIELDS = _SPAN
SAMPLES_FIELDS = (*_SPAN, Field("gpus", "gpus", help="only these GPUs"),
                  Field("limit", "int", lo=1, hi=1 << 20, help="at most the last this many records"),
                  Field("reservation", "text", min_len=4, max_len=36, pattern="[0-9a-f-]{4,36}",
                        help="a booking's ID or a prefix of it: only the records that credit it"))
EVENTS_FIELDS = (*_SPAN, Field("min_idle_s", "int", lo=0, help="shortest idle stretch that counts, seconds"))
JOB_LOG_FIELDS = (Field("ref", "text", min_len=1, max_len=64,
                        help="the job: its booking's list number or ID prefix, or the job's own ID prefix"),
                  Field("max_bytes", "int", lo=1, hi=1 << 20,
                        help="the last this many bytes of output (default 65536)"),
                  Field("all", "bool", help="all of it (two rotated segments at most)"))
JOBS_FIELDS = (Field("limit", "int", lo=1, hi=10000, help="at most this many jobs"),)
JOB_RETRY_FIELDS = (Field("ref", "text", min_len=1, max_len=64, help="the job (as for job_log)"),
                    Field("accept_duplicate_risk", "bool",
                          help="run an uncertain job again although it may have run already"))
PRESET_FIELDS = (Field("name", "text", min_len=1, max_len=32, pattern="[A-Za-z][A-Za-z0-9_.-]*",
                       help="the preset's name"),)
PRESET_DELETE_FIELDS = (PRESET_FIELDS[0], Field("dry_run", "bool", help="say what would be deleted; change nothing"))
BLACKOUTS_FIELDS = (Field("all", "bool", help="past windows too"),)
DATA_FIELDS = (Field("dir", "text", min_len=1, max_len=4096, help="the backup directory"),
               Field("dry_run", "bool", help="say what would happen; change nothing"))
CLEANUP_FIELDS = (Field("op_id_prefix", "text", min_len=1, max_len=128, pattern=OP_ID,
                        help="cancel your current and upcoming bookings whose op-id starts with this; "
                        + OP_ID_HELP),
                  Field("all", "bool", help="cancel all your current and upcoming bookings"),
                  Field("dry_run", "bool", help="show what would be cancelled; change nothing"))
