"""Where an operation runs: here (``LocalGateway``) or on the broker
(``BrokerGateway``).  A ``Service`` is a ledger reader plus one gateway;
private mode and the broker use the local one, a client of a shared server
the broker one.  Both take an ``Operation`` row, a typed request and the
call's context, and return the rendered typed result.
"""

from __future__ import annotations

from bk.core.errors import BkError, ConfigError, PermissionDenied
from bk.service.views import View


def authorize(op, call) -> None:
    """The table's ``who`` for ADMIN rows, checked once for every front end
    (OWNER rows check ownership in their apply, against the record)."""
    if op.who == "admin" and not call.actor.is_admin:
        raise PermissionDenied(f"only the administrator (root) may {op.summary}", hint=op.admin_hint)


def authorize_host(op, call, private: bool) -> None:
    """HOST rows: the data's owner, which in private mode is the caller."""
    if op.who == "host" and not (private or call.actor.is_admin):
        raise PermissionDenied(f"only the administrator (root) may {op.summary}", hint=op.admin_hint)


class LocalGateway:
    """Runs operations against a local ``Store``: writes in one transaction
    each (or one for a batch), host-side reads directly."""

    def __init__(self, store, service):
        self.store = store
        self.service = service

    def run(self, op, req, call):
        authorize_host(op, call, self.store.private)
        if op.accepts_loss:
            return self._accepting_loss(op, req, call)
        if op.rebinds:
            return self._rebinding(op, req, call)
        if op.access != "write":
            authorize(op, call)
            op.validate(req)
            return op.serve(self.service, req, call).rendered(View.of(call))
        outcome = self.write_batch([(op, req, call)])[0]
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    def dry_run(self, op, req, call):
        """A write asked to change nothing (``dry_run``), applied to a copy
        of the committed ledger read without the lock, as every reader
        reads it; nothing is committed, so no transaction is needed, and a
        dry run never holds the lock or a place in a commit that writers
        wait for.  The ledger's bound policy is checked as a commit would."""
        from bk.core.policy import policy_diff

        authorize_host(op, call, self.store.private)
        authorize(op, call)
        op.validate(req)
        got = self.store.read()
        call.warn(*got.warnings)
        diff = policy_diff(got.state.policy, call.policy.bound())
        if diff.conflicts:
            raise ConfigError(f"the configuration disagrees with the policy bound in {self.store.paths.ledger}: "
                              f"{diff.describe()}", "the ledger keeps the policy of its first write; ask the "
                              "administrator", details={"differences": diff.conflicts})
        return op.apply(got.state.copy(), req, call).result.rendered(View.of(call))

    def write_batch(self, items: list) -> list:
        """Several callers' writes in one transaction: the broker's group
        commit.  Each write is applied, in order, to a copy of the state the
        earlier ones left, exactly as if it had its own transaction; a
        refused one leaves no trace (its copy is dropped: the records are
        frozen, so a copy of the lists is a full rollback) and is answered
        with its error; one commit (one round of fsyncs, the cost that
        dominates a write) acknowledges them all.  Returns one rendered
        result or ``BkError`` per item, in order."""
        from bk.core.models import Mutation

        if any(op.accepts_loss or op.rebinds for op, _, _ in items):      # never batched with others
            return [self._outcome(self.run, *item) for item in items]
        ready = []
        for op, req, call in items:
            try:
                authorize(op, call)
                op.validate(req)      # the broker's decode checks, for requests made here
                ready.append((op, req, call, None))
            except BkError as e:
                ready.append((op, req, call, e))
        runnable = [x for x in ready if x[3] is None]
        if not runnable:
            return [x[3] for x in ready]

        def apply(state):
            outcomes, audit, changed, cur = [], [], False, state
            for op, req, call, refused in ready:
                if refused is not None:
                    outcomes.append(refused)
                    continue
                trial = cur.copy()
                try:
                    m = op.apply(trial, req, call)
                except BkError as e:
                    outcomes.append(e)
                    continue
                records = list(m.audit)
                if m.changed and op.name != "book" and any(r.advance is not None for r in trial.reservations):
                    # Capacity may have freed: queued bookings that asked
                    # to move earlier do so in this same commit (issue 27;
                    # with none asking, bk.service.advancing is not loaded).
                    from bk.service.advancing import after_write

                    records += after_write(cur, trial, call, self.service)
                cur = trial
                outcomes.append(m.result)
                changed = changed or m.changed
                actor = call.actor
                audit.extend({**(a.to_dict() if hasattr(a, "to_dict") else a), "uid": actor.uid,
                              "user": actor.user} for a in records)
            return Mutation(changed, audit, outcomes, state=cur)

        first = runnable[0][2]
        warnings: list[str] = []
        try:
            outcomes = self.store.transact(apply, policy=first.policy.bound(), actor_uid=first.actor.uid,
                                           actor=first.actor.user, warnings=warnings)
        except BkError as e:      # the transaction itself failed: busy, I/O, policy mismatch
            outcomes = [e] * len(ready)
        out = []
        for (_op, _req, call, _), o in zip(ready, outcomes, strict=True):
            call.warn(*warnings)
            out.append(o if isinstance(o, BaseException) else o.rendered(View.of(call)))
        return out


    @staticmethod
    def _outcome(fn, *args):
        try:
            return fn(*args)
        except BkError as e:
            return e

    def _accepting_loss(self, op, req, call):
        """A row that may commit over lost commits: it gets the witnessed
        loss, and the store accepts exactly the loss its request names."""
        op.validate(req)
        lost = self.store.lost_commits()
        warnings: list[str] = []
        try:
            result = self.store.transact(lambda state: op.apply(state, req, call, lost=lost),
                                         policy=call.policy.bound(),
                                         actor_uid=call.actor.uid, actor=call.actor.user, warnings=warnings,
                                         accept_loss=(req.ledger_seq, req.audit_seq))
        finally:
            call.warn(*warnings)
        return result.rendered(View.of(call))


    def _rebinding(self, op, req, call):
        """A row that changes the bound policy (``policy_bind``): the store's
        binding check is what it repairs, so it runs without it; the row
        itself binds only to what the host's configuration holds."""
        authorize(op, call)
        op.validate(req)
        warnings: list[str] = []
        try:
            result = self.store.transact(lambda state: op.apply(state, req, call), policy=None,
                                         actor_uid=call.actor.uid, actor=call.actor.user, warnings=warnings)
        finally:
            call.warn(*warnings)
        return result.rendered(View.of(call))


class BrokerGateway:
    """Sends operations to the broker, which runs them with the caller's
    kernel identity; the reply's JSON is the result's JSON, as the broker
    rendered it (its policy, its GPU snapshot), never recomputed here."""

    def __init__(self, connect):
        self._connect = connect        # () -> a client with .call(op, fields) -> (data, warnings)
        self._client = None

    @property
    def client(self):
        # Made on the first write: reads (bk l, bk st) never load the socket code.
        if self._client is None:
            self._client = self._connect()
        return self._client

    def run(self, op, req, call):
        data, warnings = self.client.call(op.name, op.encode(req))
        call.warn(*warnings)
        return op.result.from_wire(data)


class HostGateway:
    """The broker's own writes, run on the host while no broker runs: for
    the administrator in a maintenance stop (``bk admin gpu-policy``, whose
    rebind would otherwise wait for a broker that refuses to start until
    the binding agrees).

    The store accepts one writer account, the service's (``Store`` refuses
    any other euid, root included, so that every file it makes has that
    owner).  Root becomes it only in a forked child: ``setgroups``,
    ``setgid``, ``setuid`` cannot be undone, and the parent stays root.
    The child runs the row through a ``LocalGateway`` under the store's
    lock, the one the broker takes for every write, so a broker that
    started meanwhile is only serialised with it, never raced.  The actor
    is still the caller (the audit log says root did it).  The child sends
    the result's wire JSON, or the error's, through a pipe and exits with
    ``os._exit``: nothing of the parent's (atexit handlers, buffered
    output) runs twice."""

    def __init__(self, service):
        self.service = service

    def run(self, op, req, call):
        import json
        import os

        from bk.core.errors import Internal, error_from

        settings = self.service.settings
        uid, gid = settings["service_uid"], settings["service_gid"]
        if uid is None or gid is None or os.geteuid() != 0:
            raise PermissionDenied("only root may write the shared ledger without the broker",
                                   hint=op.admin_hint)
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:       # the child: never returns
            os.close(r)
            try:
                reply = self._serve(op, req, call, uid, gid)
            except BkError as e:
                reply = {"ok": False, "error": e.to_json()}
            except BaseException as e:      # noqa: BLE001  (reported to the parent, which raises it)
                reply = {"ok": False, "error": {"code": "internal", "message": f"{type(e).__name__}: {e}"}}
            try:
                with os.fdopen(w, "wb") as f:
                    f.write(json.dumps(reply).encode())
            finally:
                os._exit(0)
        os.close(w)
        with os.fdopen(r, "rb") as f:
            raw = f.read()
        _pid, status = os.waitpid(pid, 0)
        try:
            reply = json.loads(raw)
        except ValueError:
            raise Internal(f"the {op.name} child (uid {uid}) gave no reply (wait status {status})") from None
        call.warn(*reply.get("warnings", ()))
        if not reply.get("ok"):
            err = reply.get("error") or {}
            raise error_from(err.get("code"), err.get("message"), err.get("hint"), err.get("details"))
        return op.result.from_wire(reply["data"])

    def _serve(self, op, req, call, uid: int, gid: int) -> dict:
        import os

        from bk.service.app import make_store

        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)
        store = make_store(self.service.settings, clock_fn=lambda: call.now, owner_uid=uid,
                           capacity=call.policy.max_shared_users)
        result = LocalGateway(store, self.service).run(op, req, call)
        return {"ok": True, "data": result.to_wire(), "warnings": list(call.warnings)}
