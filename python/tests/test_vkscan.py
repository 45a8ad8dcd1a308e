"""The vkscan Python package against a real vkscand.

The daemon is $VKSCAND (else build/daemon/vkscand of this checkout), started
on a temporary socket and awaited through its READY=1 datagram on a
test-owned $NOTIFY_SOCKET. Results do not depend on the engine it picks.
Run by ./dev test (/usr/bin/python3 -m pytest python/tests).
"""
import io
import os
import pathlib
import signal
import socket
import subprocess
import tempfile
import threading
import time

import pytest

import vkscan

ROOT = pathlib.Path(__file__).resolve().parents[2]


class Daemon:
    def __init__(self, *flags):
        self.dir = tempfile.mkdtemp(prefix="vkpy-")
        self.sock = os.path.join(self.dir, "vkscand.sock")
        notify = os.path.join(self.dir, "notify")
        ns = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        ns.bind(notify)
        binary = os.environ.get("VKSCAND") or str(ROOT / "build" / "daemon" / "vkscand")
        env = dict(os.environ, NOTIFY_SOCKET=notify)
        self.proc = subprocess.Popen(
            [binary, "--config", "", "--socket", self.sock, "--state-dir",
             os.path.join(self.dir, "state"), "--socket-mode", "0666", "--log-level", "warning",
             *flags], env=env)
        ns.settimeout(0.5)
        try:
            for _ in range(240):
                try:
                    if b"READY=1" in ns.recv(512):
                        return
                except socket.timeout:
                    pass
                assert self.proc.poll() is None, "vkscand exited at start"
            raise AssertionError("vkscand did not become ready")
        finally:
            ns.close()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=120)
        subprocess.run(["rm", "-rf", self.dir], check=False)
        return self.proc.returncode


@pytest.fixture(scope="module")
def daemon():
    d = Daemon("--max-buffers", "3", "--max-rules", "3",
               "--max-frame", "256K")
    yield d
    assert d.stop() == 0


@pytest.fixture
def client(daemon):
    with vkscan.Client(daemon.sock) as c:
        yield c


RULES = "secret:/password=hunter2/i\nelf:/\\x7fELF/\nbad:/(unclosed/\n"
DATA = b"..PASSWORD=hunter2..\x7fELF.."


def test_version_and_info(client):
    assert vkscan.library_version() == "0.1.0"
    info = client.info()
    assert info["server"].startswith("vkscand ")
    assert info["protocol"] == 1
    assert info["max_buffers"] == 3
    assert isinstance(info["devices"], list)
    assert client.hello()["server"] == info["server"]
    client.ping()


def test_load_rejects_as_data_and_scan(client):
    cat = client.load(RULES)
    assert cat.rules == ["secret", "elf"]
    assert len(cat.fingerprint) == 32 and len(cat.source) == 32
    assert len(cat.rejects) == 1
    r = cat.rejects[0]
    assert (r.id, r.line, r.index) == ("bad", 3, 2)
    assert r.message
    assert "2 rules" in repr(cat)
    matches = cat.scan(DATA)
    assert [(m.rule, m.end) for m in matches] == [("secret", 18), ("elf", 24)]
    m = matches[0]
    assert m.start is None and m.buffer == 0 and m.index == 0 and m.count == 1
    assert isinstance(m, vkscan.Match)
    # The same rules again: catalog.has finds them, nothing is sent.
    again = client.load(RULES.encode())
    assert not again.rules_sent and again.fingerprint == cat.fingerprint
    assert client.load(RULES, always_send=True).rules_sent
    assert client.has(cat.fingerprint)


def test_every_input_kind(client, tmp_path):
    cat = client.load("x:/needle/\n")
    path = tmp_path / "f.bin"
    path.write_bytes(b"--needle--" * 3)
    want = [8, 18, 28]
    assert [m.end for m in cat.scan(path.read_bytes())] == want
    assert [m.end for m in cat.scan(bytearray(path.read_bytes()))] == want
    assert [m.end for m in cat.scan(memoryview(path.read_bytes())[10:])] == [8, 18]
    assert [m.end for m in cat.scan(str(path))] == want
    assert [m.end for m in cat.scan(path)] == want  # os.PathLike
    with open(path, "rb") as f:
        f.read(5)  # the daemon reads the whole file, from offset 0
        assert [m.end for m in cat.scan(f)] == want
        assert [m.end for m in cat.scan(f.fileno())] == want
    assert [m.end for m in cat.scan(io.BytesIO(b"needle"))] == [6]
    with pytest.raises(TypeError):
        cat.scan(3.5)
    with pytest.raises(TypeError):
        cat.scan(io.StringIO("needle"))


def test_load_from_path(client, tmp_path):
    p = tmp_path / "rules.txt"
    p.write_text("a:/abc/\n")
    for arg in (p, str(p)):
        cat = client.load(arg)
        assert cat.rules == ["a"]
        assert [m.end for m in cat.scan(b"abcabc")] == [3, 6]
    with pytest.raises(TypeError):
        client.load(42)


def test_large_buffer_goes_by_memfd(client):
    # max-frame is 256 KiB: 1 MiB inline only works as a memfd (libvkscan).
    cat = client.load("x:/needle/\n")
    big = bytearray(b"-" * (1 << 20))
    big[-6:] = b"needle"
    assert [m.end for m in cat.scan(bytes(big))] == [1 << 20]


def test_scan_many_modes_and_telemetry(client):
    cat = client.load("x:/ab/\n")
    res = cat.scan_many([b"abab", b"zz", b"ab"])
    assert [(m.buffer, m.end) for m in res.matches] == [(0, 2), (0, 4), (2, 2)]
    assert [b.code for b in res.buffers] == [0, 0, 0]
    assert res.buffers[0].hits == 2 and res.buffers[0].bytes == 4
    assert "total_ns" in res.telemetry
    first = cat.scan(b"ababab", mode=vkscan.Report.FIRST)
    assert [m.end for m in first] == [2]
    count = cat.scan(b"ababab", mode=vkscan.Report.COUNT)
    assert [(m.end, m.count) for m in count] == [(2, 3)]
    assert len(cat.scan(b"ab" * 10, max_hits=4)) == 4
    # A buffer the daemon cannot read fails alone.
    res = cat.scan_many([b"ab", "/"])
    assert res.buffers[0].code == 0
    assert res.buffers[1].code == vkscan.BadFdError.code and res.buffers[1].message


def test_stats_and_catalog_context_manager(client):
    before = client.stats()  # the tenant.* keys: every caller gets them
    assert isinstance(before["tenant.served_scans"], int)
    with client.load("y:/qq/\n") as cat:
        cat.scan(b"qq")
        fp = cat.fingerprint
    assert not client.has(fp)  # dropped on exit
    assert client.stats()["tenant.served_scans"] == before["tenant.served_scans"] + 1
    assert client.drop(fp) is False


def test_threads_scan_in_parallel(daemon):
    # Each thread has its own Client; calls release the GIL.
    errors = []

    def work():
        try:
            with vkscan.Client(daemon.sock) as c:
                cat = c.load("t:/thread/\n")
                for _ in range(5):
                    assert [m.end for m in cat.scan(b"a thread")] == [8]
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    ts = [threading.Thread(target=work) for _ in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert errors == []


# ---- errors -----------------------------------------------------------------------


def test_every_code_has_its_class():
    names = {
        1001: "FrameTooLargeError", 1002: "BadFrameError", 1003: "BadTypeError",
        1004: "MissingFieldError", 1005: "BadValueError", 1006: "DepthError", 1007: "LimitError",
        1008: "UnknownOpError", 1009: "VersionError", 1010: "UnknownCatalogError",
        1011: "BadFdError", 1012: "TooManyBuffersError", 1013: "TooManyRulesError",
        1014: "TooManyFdsError", 1015: "RulesError", 1016: "BusyError", 1017: "TimeoutError",
        1018: "DeviceError", 1019: "ShutdownError", 1020: "InternalError",
        1021: "ProtocolError", 1022: "ClosedError", 1023: "DeniedError",
    }
    assert len(names) == 1023 - 1000
    for code, name in names.items():
        cls = getattr(vkscan, name)
        assert cls.code == code and issubclass(cls, vkscan.Error)
        for c in (code, -code):
            e = vkscan.error_for_code(c, "what happened")
            assert type(e) is cls and e.code == code and str(e) == "what happened"
            assert e.message == "what happened"
    assert issubclass(vkscan.TimeoutError, TimeoutError)
    assert issubclass(vkscan.DeniedError, PermissionError)
    assert issubclass(vkscan.ClosedError, ConnectionError)
    e = vkscan.error_for_code(-2, "no such file")
    assert type(e) is vkscan.ConnectError and e.errno == 2 and isinstance(e, OSError)
    assert type(vkscan.error_for_code(4242, "x")) is vkscan.Error


def test_connect_error():
    with pytest.raises(vkscan.ConnectError) as ei:
        vkscan.Client("/nonexistent/vkscand.sock", connect_timeout_ms=100)
    assert ei.value.errno == 2 and "/nonexistent/vkscand.sock" in str(ei.value)


def test_unknown_catalog(client):
    cat = client.load("u:/unknown-cat/\n")
    assert cat.drop() is True
    with pytest.raises(vkscan.UnknownCatalogError) as ei:
        cat.scan(b"x")
    assert "load" in ei.value.message


def test_bad_fd(client, tmp_path):
    cat = client.load("b:/x/\n")
    with pytest.raises(vkscan.BadFdError):
        cat.scan(str(tmp_path))  # a directory cannot be read


def test_too_many_buffers_and_rules(client):
    cat = client.load("m:/x/\n")
    with pytest.raises(vkscan.TooManyBuffersError):
        cat.scan_many([b"x"] * 4)
    with pytest.raises(vkscan.TooManyRulesError):
        client.load({"a": "a", "b": "b", "c": "c", "d": "d"})


def test_load_rules_one_by_one(client):
    cat = client.load([vkscan.Rule("lit", "a.b", kind="literal"),
                       ("hex", "41 42", None, "hex"),
                       ("re", "x+y", "i")])
    assert cat.rules == ["lit", "hex", "re"] and cat.rejects == []
    bad = client.load([("ok", "x"), ("bad", "(")])
    assert [(r.id, r.line, r.index) for r in bad.rejects] == [("bad", 0, 1)]
    got = sorted((m.rule, m.end) for m in cat.scan(b"a.b AB XXY axb"))
    assert got == [("hex", 6), ("lit", 3), ("re", 10)]
    assert client.load({"d": b"abc"}).rules == ["d"]
    with pytest.raises(ValueError):
        client.load([("k", "x", "", "glob")])
    with pytest.raises(TypeError):
        client.load([("only-id",)])


def test_catalog_quota_releases_idle_catalogs():
    d = Daemon("--tenant-max-catalogs", "2")
    try:
        with vkscan.Client(d.sock) as c:
            q0 = c.load("q0:/quota0/\n")
            q1 = c.load("q1:/quota1/\n")
            # both held by open streams: no room, and the error says why
            with q0.stream() as s0, q1.stream():
                with pytest.raises(vkscan.BusyError) as ei:
                    c.load("q2:/quota2/\n")
                assert "tenant-max-catalogs" in ei.value.message
                assert "in use" in ei.value.message
                s0.close()
                # q0 is idle and the least recently used: it makes the room
                q2 = c.load("q2:/quota2/\n")
                assert [(m.rule, m.end) for m in q2.scan(b"xquota2")] == [("q2", 7)]
                assert c.has(q1.fingerprint) and not c.has(q0.fingerprint)
                with pytest.raises(vkscan.UnknownCatalogError):
                    q0.scan(b"quota0")
            assert c.stats()["catalog_tenant_evictions"] == 1
    finally:
        assert d.stop() == 0


def test_closed_client(daemon):
    c = vkscan.Client(daemon.sock)
    c.close()
    assert c.closed
    with pytest.raises(vkscan.ClosedError):
        c.ping()
    c.close()  # twice is fine


def test_denied_and_daemon_gone():
    other = 65534 if os.getuid() != 65534 else 65533
    d = Daemon("--allow-uids", str(other))
    try:
        with pytest.raises(vkscan.DeniedError) as ei:
            vkscan.Client(d.sock, retries=0)
        assert str(os.getuid()) in ei.value.message
    finally:
        d.stop()
    d = Daemon()
    c = vkscan.Client(d.sock, retries=1)
    d.stop()
    with pytest.raises((vkscan.ClosedError, vkscan.ShutdownError)):
        c.ping()
    c.close()


def test_stream_matches_across_writes(client):
    cat = client.load("lit:/needle/\nword:/foo\\b/\n")
    with cat.stream() as st:
        assert st.state_bytes > 0
        assert st.write(b"xxnee") == []
        got = st.write(b"dle foo")
        assert [(m.rule, m.end) for m in got] == [("lit", 8)]
        assert st.offset == 12
    # `foo\b` at the very end is decided by the close (the context exit)
    assert [(m.rule, m.end) for m in st.last] == [("word", 12)]
    assert st.closed
    st2 = cat.stream()
    assert [(m.rule, m.end) for m in st2.write(b"foo ")] == [("word", 3)]
    assert st2.close() == []
    with pytest.raises(vkscan.Error):
        st2.write(b"more")


def test_stream_equals_block_scan(client):
    cat = client.load("lit:/needle/\ngap:/a[^z]*q/\neol:/zq$/\n")
    data = b"".join([b"needle", b"a", b"bq", b"zq\n", b"nee", b"dle", b"zq"] * 50)
    want = [(m.rule, m.end) for m in cat.scan(data)]
    got = []
    with cat.stream() as st:
        for i in range(0, len(data), 7):
            got += [(m.rule, m.end) for m in st.write(data[i:i + 7])]
    got += [(m.rule, m.end) for m in st.last]
    assert sorted(got, key=lambda x: (x[1], x[0])) == sorted(want, key=lambda x: (x[1], x[0]))
    assert len(got) > 100


def test_stream_count_mode(client):
    # one Match per rule and piece, `count` of the piece's matches; the sums
    # equal a block scan's counts
    cat = client.load("a:/a/\nab:/ab/\n")
    data = b"ab a xab aa " * 400
    want = {m.rule: m.count for m in cat.scan(data, mode=vkscan.Report.COUNT)}
    got = {"a": 0, "ab": 0}
    with cat.stream(mode=vkscan.Report.COUNT) as st:
        for i in range(0, len(data), 1000):
            ms = st.write(data[i:i + 1000])
            assert len({m.rule for m in ms}) == len(ms)
            for m in ms:
                got[m.rule] += m.count
    assert got == want and want["a"] == 2000 and want["ab"] == 800
    with pytest.raises(vkscan.Error):
        cat.stream(mode=vkscan.Report.FIRST)


def test_stream_pipelined_send_recv(client):
    # pieces of two streams sent before any reply: each stream's replies
    # come back in the order sent, with its own offsets
    cat = client.load("lit:/needle/\nword:/foo\\b/\n")
    a, b = cat.stream(), cat.stream()
    for i in range(20):
        a.send(b"xx needle")
        b.send(b"foo " if i % 2 else b"....")
    assert a.inflight == 20 and b.inflight == 20
    with pytest.raises(vkscan.Error):
        a.close()  # pieces in flight: the stream stays open
    with pytest.raises(vkscan.Error):
        a.write(b"x")
    for i in range(20):
        assert [(m.rule, m.end) for m in b.recv()] == ([("word", 4 * i + 3)] if i % 2 else [])
        assert [(m.rule, m.end) for m in a.recv()] == [("lit", 9 * i + 9)]
    assert a.inflight == 0 and a.offset == 180
    assert a.close() == [] and b.close() == []
    c = cat.stream()
    c.send(b"needle")
    del c  # dropped with a piece in flight: its reply is taken, the stream closed


def test_stream_write_many_and_close_many(client):
    # writes to streams in one request, a stream twice in order; the close
    # of many returns each stream's end-decided matches (the test daemon
    # takes 3 buffers per request)
    cat = client.load("lit:/needle/\nword:/foo\\b/\n")
    a, b, c = cat.stream(), cat.stream(), cat.stream()
    got = client.write_many([(a, b"xneedle"), (b, b"nee"), (b, b"dle foo")])
    assert [[(m.rule, m.end) for m in r] for r in got] == [[("lit", 7)], [], [("lit", 6)]]
    assert b.offset == 10
    assert client.write_many([(c, b"foo")]) == [[]]
    got = client.write_many([(a, b"..needle"), (c, b" ")])
    assert [(m.rule, m.end) for m in got[0]] == [("lit", 15)]
    assert [(m.rule, m.end) for m in got[1]] == [("word", 3)]
    last = client.close_many([a, b, c])
    assert [[(m.rule, m.end) for m in r] for r in last] == [[], [("word", 10)], []]
    assert a.closed and b.closed and c.closed
    with pytest.raises(vkscan.Error):
        client.write_many([(a, b"x")])  # closed streams are refused


def test_starts_of_flag_L_rules(client):
    cat = client.load("a:/foo.*bar/L\nb:/bar/\n")
    got = cat.scan(b"xfoo foo bar")
    assert [(m.rule, m.start, m.end) for m in got] == [("a", 1, 12), ("b", None, 12)]
    # starts=True: every rule gets its start
    got = cat.scan(b"xfoo foo bar", starts=True)
    assert [(m.rule, m.start, m.end) for m in got] == [("a", 1, 12), ("b", 9, 12)]
    # a stream cannot report starts: a catalog with L rules is refused
    with pytest.raises(vkscan.Error, match="flag L"):
        cat.stream()
