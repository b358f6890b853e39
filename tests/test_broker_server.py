"""The socket server in this process, as whoever runs the tests.

The broker here serves a real ``Service`` over a real shared-mode ledger in
a temporary directory owned by the current user (the service account of
this test).  What needs other accounts is in test_broker_users.py and
test_broker_robustness.py.
"""

from __future__ import annotations

import fcntl
import os
import socket
import stat
import threading
import time

import pytest

from bk.broker.handlers import Dispatcher
from bk.broker.server import Broker, Plan, check_owned_dir, peer_of
from bk.core.errors import Busy, ConfigError, PermissionDenied, Unavailable
from bk.gpu.sim import CountBackend
from bk.ipc import protocol
from bk.ipc.client import BrokerClient
from bk.service import Empty, ListRequest, RecoverRequest
from bk.service.app import Service
from bk.service.requests import BookRequest, CancelRequest, EditRequest
from bk.service.telemetry import Telemetry
from bk.store.config import KEYS, Settings
from bk.store.paths import Locations


def listed(app, scope: str) -> tuple:
    return app.run("list", ListRequest(scope)).reservations


def wait_for(predicate, timeout=10.0, what="condition"):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


@pytest.fixture
def base():
    import shutil
    import tempfile

    # Short path: AF_UNIX socket names are limited to 107 bytes.
    d = tempfile.mkdtemp(prefix="bks", dir="/tmp")
    os.chmod(d, 0o755)
    os.mkdir(os.path.join(d, "data"), 0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def settings_for(base: str) -> Settings:
    values = {k: key.default for k, key in KEYS.items()}
    data = os.path.join(base, "data")
    values.update(socket=os.path.join(base, "b.sock"), service_uid=os.geteuid(), gpu_count=4,
                  data_dir=data)
    return Settings(Locations("shared", data, None, True, base), values, None)


def telemetry() -> Telemetry:
    from bk import clock

    return Telemetry(lambda: CountBackend(4), clock=clock.now)


class Running:
    def __init__(self, base: str, **kw):
        self.settings = settings_for(base)
        self.service = Service.local(self.settings, telemetry(), owner_uid=os.geteuid())
        self.lines: list[str] = []
        self.plan = Plan("test", self.settings.data_dir, self.settings["socket"], os.geteuid(), "all", None)
        self.broker = Broker(self.plan, Dispatcher(self.service, log=self.lines.append),
                             log=self.lines.append, **kw)
        self.thread: threading.Thread | None = None

    def __enter__(self):
        self.broker.start()
        self.thread = threading.Thread(target=self.broker.serve)
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.broker.stop()
        self.thread.join(30)
        assert not self.thread.is_alive()

    @property
    def path(self) -> str:
        return self.plan.socket_path

    def client(self, **kw) -> BrokerClient:
        return BrokerClient(self.path, service_uid=os.geteuid(), **kw)

    def remote(self) -> Service:
        return Service.remote(self.settings, telemetry(), connect=self.client)


def raw(path: str) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(10)
    s.connect(path)
    return s


def ask(s: socket.socket, obj) -> dict | None:
    s.sendall(protocol.encode(obj))
    body = protocol.recv_frame(s, idle_timeout=10, frame_timeout=10)
    return None if body is None else protocol.decode(body)


# ------------------------------------------------------------- serving

def test_remote_service_round_trip_matches_local_results(base):
    with Running(base) as r:
        remote = r.remote()
        made = remote.run("book", BookRequest(count=2, duration=1800, note="n"))
        assert made.status == "created" and made.reservation.uid == os.geteuid()
        local = r.service.ledger().find(made.reservation.id)
        assert local == made.reservation               # the same object, field for field
        assert listed(remote, "all")[0].id == made.reservation.id   # reads come from the file
        edited = remote.run("edit", EditRequest(ref=made.reservation.id, note="m"))
        assert edited.status == "updated" and edited.reservation.note == "m"
        dry = remote.run("book", BookRequest(count=1, duration=600, dry_run=True))
        assert dry.dry_run and r.service.ledger().find(dry.reservation.id) is None
        gone = remote.run("cancel", CancelRequest(ref=made.reservation.id))
        assert gone.status == "cancelled" and gone.reservation.cancelled_at is not None
        again = remote.run("book", BookRequest(count=1, duration=600, op_id="k"))
        assert remote.run("book", BookRequest(count=1, duration=600, op_id="k")).status == "exists"
        assert again.reservation.op_id == "k"


def test_peer_credentials_are_this_process(base):
    with Running(base) as r:
        data, _ = r.client().call("ping")
        assert data["peer"]["uid"] == os.getuid() and data["peer"]["pid"] == os.getpid()
        with raw(r.path) as s:
            assert peer_of(s).uid == os.geteuid()      # and the broker's, seen from here


def test_client_refuses_a_listener_of_another_account(base):
    with Running(base) as r:
        with pytest.raises(Unavailable, match="refusing"):
            BrokerClient(r.path, service_uid=os.geteuid() + 1).call("ping")


def test_client_without_broker_is_unavailable_69(base):
    c = BrokerClient(os.path.join(base, "b.sock"))
    with pytest.raises(Unavailable) as e:
        c.call("ping")
    assert e.value.exit_code == 69 and "systemctl status gpubk-broker" in e.value.hint
    dead = socket.socket(socket.AF_UNIX)
    dead.bind(os.path.join(base, "b.sock"))
    dead.close()                                        # a socket file nobody listens on
    with pytest.raises(Unavailable, match="nobody is listening"):
        c.call("ping")


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores socket permissions")
def test_client_without_permission_is_denied_5(base):
    path = os.path.join(base, "b.sock")
    s = socket.socket(socket.AF_UNIX)
    s.bind(path)
    s.listen(1)
    os.chmod(path, 0)
    try:
        with pytest.raises(PermissionDenied):
            BrokerClient(path).call("ping")
    finally:
        s.close()


def test_client_limit_answers_busy_and_frees_slots(base):
    with Running(base, max_clients=2) as r:
        held = [raw(r.path), raw(r.path)]
        for s in held:
            assert ask(s, {"op": "ping"})["ok"]        # both accepted and holding a slot
        with raw(r.path) as third:
            body = protocol.recv_frame(third, idle_timeout=10, frame_timeout=10)
            reply = protocol.decode(body)
            assert reply["error"]["code"] == "busy" and reply["error"]["details"]["reason"] == "max_clients"
            assert protocol.recv_frame(third, idle_timeout=10, frame_timeout=10) is None
        # A client retries that refusal by itself while a slot frees up.
        threading.Timer(0.2, held.pop().close).start()
        data, _ = r.client().call("ping")
        assert data["peer"]["uid"] == os.getuid()
        for s in held:
            s.close()


def test_a_stalled_client_holds_only_its_own_connection(base):
    with Running(base, frame_timeout=0.5) as r:
        with raw(r.path) as stalled:
            stalled.sendall(protocol.encode({"op": "ping"})[:5])
            for _ in range(3):
                assert r.client().call("ping")[0]
            assert protocol.recv_frame(stalled, idle_timeout=10, frame_timeout=10) is None


def test_oversized_reply_and_request_limits(base):
    with Running(base) as r:
        with raw(r.path) as s:
            s.sendall((protocol.MAX_FRAME + 1).to_bytes(4, "big"))
            reply = protocol.decode(protocol.recv_frame(s, idle_timeout=10, frame_timeout=10))
            assert "limit" in reply["error"]["message"]
            assert protocol.recv_frame(s, idle_timeout=10, frame_timeout=10) is None


# ------------------------------------------------------------- start and stop

def test_stop_wakes_idle_connections_and_removes_only_its_socket(base):
    r = Running(base, idle_timeout=60)
    with r:
        idle = raw(r.path)
        assert ask(idle, {"op": "ping"})["ok"]
        t0 = time.monotonic()
    assert time.monotonic() - t0 < 10                 # not the 60 s idle timeout
    assert protocol.recv_frame(idle, idle_timeout=5, frame_timeout=5) is None
    idle.close()
    assert not os.path.exists(r.path)
    assert any("stopped after" in line for line in r.lines)


def test_a_successor_socket_is_not_removed_on_stop(base):
    r = Running(base)
    with r:
        other = socket.socket(socket.AF_UNIX)
        tmp = os.path.join(base, "x.sock")
        other.bind(tmp)
        os.rename(tmp, r.path)                        # someone replaced our socket
    assert stat.S_ISSOCK(os.lstat(r.path).st_mode)
    other.close()


def test_a_dead_socket_of_ours_is_replaced(base):
    path = os.path.join(base, "b.sock")
    dead = socket.socket(socket.AF_UNIX)
    dead.bind(path)
    dead.close()
    with Running(base) as r:
        assert r.client().call("ping")[0]
        assert stat.S_IMODE(os.lstat(path).st_mode) == 0o666


def test_a_file_that_is_not_a_socket_is_never_touched(base):
    path = os.path.join(base, "b.sock")
    with open(path, "w") as f:
        f.write("precious")
    r = Running(base)
    with pytest.raises(ConfigError, match="not a socket"):
        r.broker.start()
    assert open(path).read() == "precious"
    os.symlink("/etc/passwd", path + "2")
    r.plan = r.broker.plan = Plan("t", r.plan.data_dir, path + "2", os.geteuid(), "all", None)
    with pytest.raises(ConfigError):
        r.broker.start()


def test_a_live_listener_at_the_path_is_not_replaced(base):
    path = os.path.join(base, "b.sock")
    live = socket.socket(socket.AF_UNIX)
    live.bind(path)
    live.listen(1)
    try:
        with pytest.raises(Busy, match="answers"):
            Running(base).broker.start()
        assert os.path.exists(path)
    finally:
        live.close()


def test_the_broker_lock_keeps_a_second_broker_out(base):
    path = os.path.join(base, "b.sock")
    fd = os.open(path + ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, b"4242\n")
        # The holder is this process, as the kernel's lock table says; 4242
        # is only what was written into the file.
        with pytest.raises(Busy, match=rf"\(pid {os.getpid()}\)"):
            Running(base).broker.start()
        assert not os.path.exists(path)
    finally:
        os.close(fd)


def test_check_owned_dir_rules(base):
    data = os.path.join(base, "data")
    assert check_owned_dir(data, os.geteuid(), "data directory")
    os.chmod(data, 0o775)
    with pytest.raises(ConfigError, match="writable by group"):
        check_owned_dir(data, os.geteuid(), "data directory")
    os.chmod(data, 0o755)
    with pytest.raises(ConfigError, match="owned by"):
        check_owned_dir(data, os.geteuid() + 1, "data directory")
    os.symlink(data, os.path.join(base, "link"))
    with pytest.raises(ConfigError, match="not a directory"):
        check_owned_dir(os.path.join(base, "link"), os.geteuid(), "data directory")
    with pytest.raises(ConfigError, match="does not exist"):
        check_owned_dir(os.path.join(base, "nope"), os.geteuid(), "data directory")
    os.chmod(base, 0o777)                             # a writable, non-sticky parent
    try:
        with pytest.raises(ConfigError, match="others can change"):
            check_owned_dir(data, os.geteuid(), "data directory")
    finally:
        os.chmod(base, 0o755)


class SlowService:
    """The real service whose booking waits until the test lets it finish."""

    def __init__(self, real: Service):
        self.real = real
        self.gateway = self
        self.entered, self.release = threading.Event(), threading.Event()

    def __getattr__(self, name):
        return getattr(self.real, name)

    def write_batch(self, items):
        self.entered.set()
        assert self.release.wait(30)
        return self.real.gateway.write_batch(items)


def test_stop_lets_a_request_in_progress_finish_and_answer(base):
    r = Running(base)
    slow = SlowService(r.service)
    r.broker.dispatcher = Dispatcher(slow, log=r.lines.append)
    replies = []
    with r:
        t = threading.Thread(target=lambda: replies.append(r.client().call("book", {"count": 1, "duration": 1800})))
        t.start()
        assert slow.entered.wait(30)
        stopper = threading.Thread(target=r.broker.stop)
        stopper.start()
        stopper.join()
        wait_for(lambda: not os.path.exists(r.path), what="the socket to go")   # no new clients
        slow.release.set()
        t.join(30)
    data, _ = replies[0]
    assert data["status"] == "created"
    assert r.service.ledger().find(data["record"]["id"]) is not None


@pytest.mark.slow
def test_fuzzed_frames_in_process_leave_the_ledger_alone(base):
    """The seeded fuzz of test_broker_robustness.py, smaller, for any user."""
    from helpers_broker import fuzz_bodies

    seed = 7
    with Running(base) as r:
        r.remote().run("book", BookRequest(count=1, duration=1800))
        ledger = os.path.join(r.settings.data_dir, "ledger.json")
        before = open(ledger, "rb").read()
        s = raw(r.path)
        try:
            for i, body in enumerate(fuzz_bodies(seed, 3000)):
                s.sendall(len(body).to_bytes(4, "big") + body)
                reply = protocol.decode(protocol.recv_frame(s, idle_timeout=10, frame_timeout=10))
                assert reply.get("error", {}).get("code") != "internal", f"seed {seed}, frame {i}: {body[:200]!r}"
        finally:
            s.close()
        assert open(ledger, "rb").read() == before
        assert not [line for line in r.lines if "internal error" in line]


def test_the_broker_replies_with_the_json_the_private_service_returns(base, tmp_path):
    """Same request, same ledger, same clock, same IDs: the broker's JSON for
    book, edit and cancel is what a private-mode service returns, because it
    is the same typed result rendered once (the client does not recompute)."""
    import pwd

    from bk.service import open_app
    from bk.service.context import Actor
    from bk.service.requests import BookRequest, CancelRequest, EditRequest

    t0 = 1_800_000_000
    me = Actor(os.geteuid(), pwd.getpwuid(os.geteuid()).pw_name)
    env = {"BK_DATA_DIR": str(tmp_path / "private"), "HOME": str(tmp_path), "BK_GPU_COUNT": "4",
           "XDG_CACHE_HOME": str(tmp_path / "cache"), "XDG_CONFIG_HOME": str(tmp_path / "cfg")}
    private = open_app(env, actor=me, clock_fn=lambda: t0)

    def ids():
        n = iter(range(1, 10**6))
        return lambda: f"{next(n):08x}-0000-4000-8000-000000000000"
    private.id_source = ids()
    r = Running(base)
    r.service = Service.local(r.settings, telemetry(), owner_uid=os.geteuid(), clock_fn=lambda: t0)
    r.service.id_source = ids()
    r.broker.dispatcher = Dispatcher(r.service, log=r.lines.append)
    with r:
        remote = r.remote()
        steps = [
            lambda app, rid: app.run("book", BookRequest(count=2, duration=1800, note="n", op_id="k1")),
            lambda app, rid: app.run("book", BookRequest(count=1, duration=600, start=t0 + 3600, mem_mib=4096)),
            lambda app, rid: app.run("book", BookRequest(count=2, duration=1800, note="n", op_id="k1")),  # a replay
            lambda app, rid: app.run("edit", EditRequest(ref=rid, duration=3600, note="m")),
            lambda app, rid: app.run("edit", EditRequest(ref=rid, note="m")),                           # unchanged
            lambda app, rid: app.run("book", BookRequest(count=1, duration=600, dry_run=True)),
            lambda app, rid: app.run("cancel", CancelRequest(ref=rid, dry_run=True)),
            lambda app, rid: app.run("cancel", CancelRequest(ref=rid)),
        ]
        rid = {}
        for i, step in enumerate(steps):
            got = {}
            for name, app in (("private", private), ("broker", remote)):
                result = step(app, rid.get(name))
                got[name] = result.to_json()
                rid.setdefault(name, result.reservation.id)
            assert got["broker"] == got["private"], f"step {i}"
        assert listed(remote, "mine") == listed(private, "mine") != ()


def test_lost_commits_through_the_broker_refuse_writes_until_the_administrator_recovers(base):
    from bk.broker.handlers import Peer
    from bk.core.errors import LostCommits

    with Running(base) as r:
        remote = r.remote()
        first = remote.run("book", BookRequest(count=1, duration=1800)).reservation
        second = remote.run("book", BookRequest(count=1, duration=1800, note="lost")).reservation
        data = r.settings.data_dir
        backups = os.path.join(data, "backups")
        with open(os.path.join(data, "ledger.json"), "w") as f:
            f.write("{")
        os.unlink(os.path.join(backups, sorted(os.listdir(backups))[-1]))
        with pytest.raises(LostCommits) as e:
            remote.run("book", BookRequest(count=1, duration=600))
        assert second.id in e.value.details["reservations"] and e.value.exit_code == 74
        # Only the administrator (a HOST row on a shared server) may look or accept.
        nobody = Peer(pid=1, uid=4242, gid=4242)
        for op in ("data_lost", "data_recover"):
            fields = {} if op == "data_lost" else {"ledger_seq": 1, "audit_seq": 2}
            reply = r.broker.dispatcher.dispatch({"op": op, "fields": fields}, nobody)
            assert reply["error"]["code"] == "permission_denied", op
        lost = remote.run("data_lost", Empty())
        assert (lost.ledger_seq, lost.audit_seq) == (1, 2)
        done = remote.run("data_recover", RecoverRequest(lost.ledger_seq, lost.audit_seq, replay=True))
        assert done.status == "recovered" and done.replayed == (second.id,)
        assert {x.id for x in listed(remote, "all")} == {first.id, second.id}
        assert remote.run("book", BookRequest(count=1, duration=600)).status == "created"
