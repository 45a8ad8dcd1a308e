"""vkscan: Python client of the vkscand GPU scanning service.

A thin layer over libvkscan (the C client library, through the vkscan._vkscan
extension): every call is one libvkscan call with the GIL released, so
threads with their own Client scan in parallel.

    import vkscan
    with vkscan.Client() as client:              # $VKSCAN_SOCKET or the system socket
        catalog = client.load("ids:/password=\\S+/i\\n")
        for m in catalog.scan(b"...password=hunter2..."):
            print(m.rule, m.end)

Errors are exceptions: one class per protocol error code (vkscan.BusyError,
vkscan.UnknownCatalogError, ...), all subclasses of vkscan.Error, which
carries the code and the daemon's message. Local failures (no daemon at the
socket, permission) raise vkscan.ConnectError, also an OSError.
"""
from __future__ import annotations

import errno as _errno
import os
import sys
from typing import Any, BinaryIO, Dict, Iterable, Iterator, List, NamedTuple, Optional, Sequence, Tuple, Union

from . import _vkscan

__all__ = [
    "Client", "Catalog", "Stream", "Match", "Rule", "Reject", "ScanResult", "BufferResult", "Report",
    "DEFAULT_SOCKET", "error_for_code", "library_version",
    "Error", "ConnectError",
]

DEFAULT_SOCKET = "/run/vkscand/vkscand.sock"


class Report:
    """Report modes of a scan (docs/protocol.md)."""
    ALL = 0    #: every (rule, end offset)
    FIRST = 1  #: the first match per (buffer, rule)
    COUNT = 2  #: one match per (buffer, rule), with the number of matches


# ---- exceptions -------------------------------------------------------------------


class Error(Exception):
    """A libvkscan failure: `code` (positive, a VKS_E_* number or an errno
    value) and `message`, the daemon's (or the library's) sentence."""

    code: int = 0

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def __str__(self) -> str:
        return self.message


class ConnectError(Error, OSError):
    """A local system error (errno): no daemon at the socket, permission
    denied, a timeout while connecting."""

    def __init__(self, code: int, message: str) -> None:
        Error.__init__(self, code, message)
        self.errno = code
        self.strerror = message
        self.args = (code, message)


# One class per protocol error code: (name, code, extra base).
_CODES = [
    ("FrameTooLargeError", _vkscan.E_FRAME_TOO_LARGE, None),
    ("BadFrameError", _vkscan.E_BAD_FRAME, None),
    ("BadTypeError", _vkscan.E_BAD_TYPE, None),
    ("MissingFieldError", _vkscan.E_MISSING_FIELD, None),
    ("BadValueError", _vkscan.E_BAD_VALUE, ValueError),
    ("DepthError", _vkscan.E_DEPTH, None),
    ("LimitError", _vkscan.E_LIMIT, None),
    ("UnknownOpError", _vkscan.E_UNKNOWN_OP, None),
    ("VersionError", _vkscan.E_VERSION, None),
    ("UnknownCatalogError", _vkscan.E_UNKNOWN_CATALOG, KeyError),
    ("BadFdError", _vkscan.E_BAD_FD, None),
    ("TooManyBuffersError", _vkscan.E_TOO_MANY_BUFFERS, None),
    ("TooManyRulesError", _vkscan.E_TOO_MANY_RULES, None),
    ("TooManyFdsError", _vkscan.E_TOO_MANY_FDS, None),
    ("RulesError", _vkscan.E_RULES, None),
    ("BusyError", _vkscan.E_BUSY, None),
    ("TimeoutError", _vkscan.E_TIMEOUT, TimeoutError),
    ("DeviceError", _vkscan.E_DEVICE, None),
    ("ShutdownError", _vkscan.E_SHUTDOWN, None),
    ("InternalError", _vkscan.E_INTERNAL, None),
    ("ProtocolError", _vkscan.E_PROTOCOL, None),
    ("ClosedError", _vkscan.E_CLOSED, ConnectionError),
    ("DeniedError", _vkscan.E_DENIED, PermissionError),
]

_BY_CODE: Dict[int, type] = {}
for _name, _code, _extra in _CODES:
    _bases = (Error,) if _extra is None else (Error, _extra)
    _cls = type(_name, _bases, {
        "__doc__": f"Error code {_code} ({_vkscan.strerror(-_code)}); see docs/protocol.md.",
        "__module__": __name__,
        "code": _code,
        "__str__": Error.__str__,
        "__init__": Error.__init__,
    })
    globals()[_name] = _cls
    _BY_CODE[_code] = _cls
    __all__.append(_name)
del _name, _code, _extra, _bases, _cls


def error_for_code(code: int, message: str) -> Error:
    """The exception vkscan raises for libvkscan's `code` (negative or
    positive): a protocol code's own class, ConnectError for an errno value,
    Error for an unknown code."""
    c = -code if code < 0 else code
    cls = _BY_CODE.get(c)
    if cls is not None:
        return cls(c, message)
    if 0 < c < 1000:
        return ConnectError(c, message)
    return Error(c, message)


_vkscan._set_error_factory(error_for_code)


def library_version() -> str:
    """The version of the libvkscan this module runs."""
    return _vkscan.library_version()


# ---- results ----------------------------------------------------------------------


class Match(NamedTuple):
    """One match: `rule` (the rule's id), `end` (end offset, relative to the
    buffer or to its fd range), `start` (the leftmost start offset when the
    daemon reports one, else None), `buffer` (its index in the scan),
    `index` (the rule's index in the catalog) and `count` (matches counted
    for Report.COUNT, else 1)."""
    rule: str
    end: int
    start: Optional[int] = None
    buffer: int = 0
    index: int = 0
    count: int = 1


class Rule(NamedTuple):
    """One rule for Client.load: `pattern` is a regex (kind "regex"), a
    literal string or a hex string such as "4d 5a ?? 00"; flags such as "i"."""
    id: str
    pattern: Union[str, bytes]
    flags: str = ""
    kind: str = "regex"


class Reject(NamedTuple):
    """A rule the compiler rejected: its position in the input, line of the
    pattern text, byte offset of the problem, id and reason."""
    index: int
    line: int
    pos: int
    id: str
    message: str


class BufferResult(NamedTuple):
    """Per-buffer status of a scan: code 0, or the error code of this buffer
    alone (others were still scanned), with its message."""
    code: int
    message: Optional[str]
    bytes: int
    hits: int
    truncated: bool


class ScanResult(NamedTuple):
    """What scan_many returns: matches of every buffer (Match.buffer says
    which), per-buffer status and the batch's telemetry."""
    matches: List[Match]
    buffers: List[BufferResult]
    telemetry: Dict[str, Union[int, float]]


RulesInput = Union[str, bytes, "os.PathLike[str]", Dict[str, Union[str, bytes]], Sequence[Any]]
ScanInput = Union[bytes, bytearray, memoryview, BinaryIO, "os.PathLike[str]", str, int]


# ---- client and catalogs ------------------------------------------------------------


class Client:
    """A connection to vkscand. `socket` defaults to $VKSCAN_SOCKET, then
    /run/vkscand/vkscand.sock. One call at a time per Client (calls from
    several threads are serialised); open one Client per thread to scan in
    parallel. Use as a context manager, or call close()."""

    def __init__(self, socket: Optional[str] = None, *, connect_timeout_ms: int = 0,
                 io_timeout_ms: int = 0, retries: int = 3, client_name: str = "python-vkscan",
                 memfd_threshold: int = 0) -> None:
        if socket is None:
            socket = os.environ.get("VKSCAN_SOCKET") or DEFAULT_SOCKET
        self.socket = os.fspath(socket)
        self._raw = _vkscan.RawClient(self.socket, connect_timeout_ms, io_timeout_ms, retries,
                                      client_name, memfd_threshold)

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Closes the connection; later calls raise ClosedError."""
        self._raw.close()

    @property
    def closed(self) -> bool:
        return bool(self._raw.closed)

    def ping(self) -> None:
        """A round trip that does no work."""
        self._raw.ping()

    def info(self) -> Dict[str, Any]:
        """The daemon's hello reply: protocol, server, limits, devices."""
        return self._raw.info()

    def hello(self) -> Dict[str, Any]:
        """Sends hello again and returns the reply."""
        return self._raw.hello()

    def stats(self) -> Dict[str, Union[int, float]]:
        """The daemon's counters (docs/daemon.md, stats keys)."""
        return self._raw.stats()

    def write_many(self, writes: Iterable[Tuple["Stream", Union[bytes, bytearray, memoryview]]]
                   ) -> List[Union[List["Match"], "Error"]]:
        """Writes to many streams of this client in one request
        (docs/protocol.md "stream.writes"): one result per (stream, data)
        pair, in order: the matches that write completes, or the Error it
        failed with alone (the others are applied)."""
        pairs = list(writes)
        hits, statuses = self._raw.stream_write_many([(st._raw, d) for st, d in pairs])
        return _many_results(hits, statuses, [st.catalog.rules for st, _ in pairs])

    def close_many(self, streams: Iterable["Stream"]) -> List[Union[List["Match"], "Error"]]:
        """Closes many streams of this client in one request: per stream, the
        matches only the end of its data decides, or its own Error."""
        sts = list(streams)
        hits, statuses = self._raw.stream_close_many([st._raw for st in sts])
        for st in sts:
            st.closed = True
        return _many_results(hits, statuses, [st.catalog.rules for st in sts])

    def load(self, rules: RulesInput, *, max_states: int = 0,
             always_send: bool = False) -> "Catalog":
        """Loads a rule set: pattern text (str or bytes holding
        `ID:/regex/flags` lines, docs/rules.md), the path of a pattern file,
        or rules one by one: a dict {id: pattern} or a sequence of Rule (or
        (id, pattern[, flags[, kind]]) tuples; kind "regex" (default),
        "literal" or "hex"). Asks the daemon first whether it holds the set
        (by source fingerprint) and sends the rules only when not. Rejected
        rules do not fail the call: they are in Catalog.rejects."""
        if isinstance(rules, (dict, list, tuple)):
            items = rules.items() if isinstance(rules, dict) else rules
            d = self._raw.load_rules([_rule_tuple(r) for r in items], max_states, always_send)
        else:
            d = self._raw.load_text(_rules_text(rules), max_states, always_send)
        return Catalog(self, d)

    def has(self, fingerprint: bytes) -> bool:
        """Whether this tenant holds the catalog with this fingerprint."""
        return self._raw.has(bytes(fingerprint))

    def drop(self, fingerprint: bytes) -> bool:
        """Releases this tenant's hold on a catalog; whether it held one."""
        return self._raw.drop(bytes(fingerprint))


_KINDS = {"literal": 0, "hex": 1, "regex": 2}


def _rule_tuple(r: Any) -> Tuple[str, int, bytes, str]:
    r = tuple(r)
    if not 2 <= len(r) <= 4:
        raise TypeError("a rule is (id, pattern[, flags[, kind]])")
    rid, pattern = r[0], r[1]
    flags = r[2] if len(r) > 2 and r[2] is not None else ""
    kind = r[3] if len(r) > 3 else "regex"
    if kind not in _KINDS:
        raise ValueError(f"rule {rid}: kind must be literal, hex or regex, not {kind!r}")
    if isinstance(pattern, str):
        pattern = pattern.encode()
    return (str(rid), _KINDS[kind], bytes(pattern), str(flags))


def _rules_text(rules: Union[str, bytes, "os.PathLike[str]"]) -> bytes:
    if isinstance(rules, os.PathLike):
        with open(rules, "rb") as f:
            return f.read()
    if isinstance(rules, bytes):
        return rules
    if isinstance(rules, str):
        if "\n" not in rules and ":/" not in rules and os.path.exists(rules):
            with open(rules, "rb") as f:
                return f.read()
        return rules.encode()
    raise TypeError(f"rules must be text, bytes or a path, not {type(rules).__name__}")


class Catalog:
    """A catalog the daemon holds for this client's tenant. `rules` lists the
    accepted rule ids (a match's index into it), `rejects` the rules the
    compiler refused, with reasons. Use as a context manager to drop it at
    the end."""

    def __init__(self, client: Client, d: Dict[str, Any]) -> None:
        self.client = client
        self.fingerprint: bytes = d["fingerprint"]
        self.source: bytes = d["source"]
        self.rules_sent: bool = d["rules_sent"]
        self.cached: bool = d["cached"]
        self.rules: List[str] = list(d["rules"])
        self.rejects: List[Reject] = [Reject(*r) for r in d["rejects"]]

    def __repr__(self) -> str:
        return (f"<vkscan.Catalog {self.fingerprint.hex()[:16]} {len(self.rules)} rules, "
                f"{len(self.rejects)} rejected>")

    def __enter__(self) -> "Catalog":
        return self

    def __exit__(self, *exc: Any) -> None:
        if not self.client.closed:
            self.drop()

    def drop(self) -> bool:
        """Releases the tenant's hold on this catalog."""
        return self.client.drop(self.fingerprint)

    def scan(self, data: ScanInput, *, mode: int = Report.ALL, max_hits: int = 0,
             timeout_ms: int = 0, starts: bool = False) -> List[Match]:
        """Scans one input: bytes, bytearray, memoryview (sent inline; 1 MiB
        and more travel as a sealed memfd), a binary file object or an int
        file descriptor (passed to the daemon, which reads the whole file
        from offset 0, whatever the current position), or a path (opened
        here, read-only, and passed as a descriptor). Returns the
        matches in order of (rule, end); raises the buffer's own error (for
        example BadFdError) when the daemon could not read it. Matches of
        rules with flag L carry their leftmost `start`; `starts=True` asks
        for it on every match."""
        res = self.scan_many([data], mode=mode, max_hits=max_hits, timeout_ms=timeout_ms,
                             starts=starts)
        b = res.buffers[0]
        if b.code != 0:
            raise error_for_code(b.code, b.message or "")
        return res.matches

    def stream(self, *, mode: int = Report.ALL) -> "Stream":
        """Opens a stream over this catalog (docs/protocol.md, "Streams"):
        data written in pieces, matches across pieces found. With
        mode=Report.COUNT each piece answers one Match per rule: the first
        end it completed and `count`, how many (Report.FIRST is refused)."""
        return Stream(self, mode)

    def scan_many(self, inputs: Iterable[ScanInput], *, mode: int = Report.ALL,
                  max_hits: int = 0, timeout_ms: int = 0, starts: bool = False) -> ScanResult:
        """Scans a batch of inputs (as scan() takes them) in one request.
        A buffer the daemon could not read fails only its own BufferResult."""
        items: List[Any] = []
        opened: List[int] = []
        try:
            for x in inputs:
                items.append(_scan_item(x, opened))
            hits, bufs, tel = self.client._raw.scan(self.fingerprint, items, mode, max_hits,
                                                     timeout_ms, starts)
        finally:
            for fd in opened:
                os.close(fd)
        rules = self.rules
        matches = [Match(rules[r] if r < len(rules) else str(r), end, start, b, r, count)
                   for (b, r, end, count, start) in hits]
        # Per-buffer codes come back negative from libvkscan: positive here,
        # as Error.code and the protocol have them.
        return ScanResult(matches, [BufferResult(abs(b[0]), *b[1:]) for b in bufs], tel)


class Stream:
    """A stream over a catalog: write() the data in pieces as it arrives and
    get back the matches each piece completes (a match may straddle
    pieces; `end` counts from the stream's first byte); close() returns the
    matches only the end of data decides (`$`, `\\b` after the last byte).
    The daemon holds `state_bytes` of state for it. It uses its Client's
    connection, which must stay open. Use as a context manager: the exit
    closes it (its last matches are then in `last`)."""

    def __init__(self, catalog: Catalog, mode: int = Report.ALL) -> None:
        self.catalog = catalog
        self._raw, self.state_bytes = catalog.client._raw.stream_open(catalog.fingerprint, mode)
        self.closed = False
        self.last: List[Match] = []

    def __enter__(self) -> "Stream":
        return self

    def __exit__(self, *exc: Any) -> None:
        if not self.closed and not self.catalog.client.closed:
            self.last = self.close()

    @property
    def offset(self) -> int:
        """Bytes written so far."""
        return int(self._raw.offset)

    def _matches(self, hits: List[Tuple[int, int, int]]) -> List[Match]:
        rules = self.catalog.rules
        return [Match(rules[r] if r < len(rules) else str(r), end, None, 0, r, count)
                for (r, end, count) in hits]

    def write(self, data: Union[bytes, bytearray, memoryview]) -> List[Match]:
        """Scans the next piece; the matches it completes, in end order."""
        return self._matches(self._raw.write(data))

    def send(self, data: Union[bytes, bytearray, memoryview]) -> None:
        """Sends the next piece without waiting for its matches (pipelining:
        the daemon batches the pieces of many streams); take them, in the
        order sent, with recv(). `data` may be reused at once."""
        self._raw.send(data)

    def recv(self) -> List[Match]:
        """The matches of the oldest piece sent with send()."""
        return self._matches(self._raw.recv())

    @property
    def inflight(self) -> int:
        """Pieces sent with send() whose matches recv() has not taken."""
        return int(self._raw.inflight)

    def close(self) -> List[Match]:
        """Ends the stream; the matches only the end of data decides. With
        pieces in flight it raises (EBUSY) and the stream stays open."""
        hits = self._raw.close()
        self.closed = True
        return self._matches(hits)


def _many_results(hits: List[Tuple[int, int, int, int]],
                  statuses: List[Tuple[int, Optional[str], int]],
                  rules: List[List[str]]) -> List[Union[List["Match"], "Error"]]:
    out: List[Union[List[Match], Error]] = [[] for _ in statuses]
    for (i, r, end, count) in hits:
        names = rules[i]
        m = out[i]
        if isinstance(m, list):
            m.append(Match(names[r] if r < len(names) else str(r), end, None, 0, r, count))
    for i, (code, message, _) in enumerate(statuses):
        if code != 0:
            out[i] = error_for_code(abs(code), message or "")
    return out


def _scan_item(x: Any, opened: List[int]) -> Any:
    if isinstance(x, (bytes, bytearray, memoryview)):
        return x
    if isinstance(x, bool):
        raise TypeError("a scan input cannot be a bool")
    if isinstance(x, int):
        return (x, 0, 0)
    if isinstance(x, (str, os.PathLike)):
        fd = os.open(x, os.O_RDONLY | os.O_CLOEXEC)
        opened.append(fd)
        return (fd, 0, 0)
    fileno = getattr(x, "fileno", None)
    if fileno is not None:
        try:
            return (fileno(), 0, 0)
        except (OSError, ValueError):
            pass  # a file object without a descriptor (io.BytesIO): read it
    read = getattr(x, "read", None)
    if read is not None:
        data = read()
        if isinstance(data, str):
            raise TypeError("scan needs a binary file object (open it with 'rb')")
        return bytes(data)
    raise TypeError(f"cannot scan {type(x).__name__}: pass bytes, a file, a path or an fd")
