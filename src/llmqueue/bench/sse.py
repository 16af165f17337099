"""Server-sent events, parsed incrementally as bytes arrive (the WHATWG HTML standard's
"event stream" format, section 9.2.6 "Interpreting an event stream").

:class:`SSEParser` is fed the body of a ``text/event-stream`` response in pieces of any size and
returns the events each piece completes, as ``(type, data)`` byte strings:

- lines end with CRLF, LF or a bare CR (a CRLF split between two pieces is one line end);
- a line starting with ``:`` is a comment; ``name: value`` sets field ``name`` (one space after
  the colon is dropped, further ones are kept); a line without a colon is a field with an empty
  value; field names are case-sensitive;
- ``data`` lines append to the event's data, joined by ``\\n``; ``event`` sets its type
  (``b"message"`` when none is given); ``id`` sets :attr:`SSEParser.last_event_id` (ignored
  if it holds a NUL); ``retry`` with ASCII digits only sets :attr:`SSEParser.retry_ms`; other
  fields are ignored;
- a blank line dispatches the event; an event with no ``data`` line is not dispatched; an event
  cut short by the end of the stream is never dispatched (the caller simply stops feeding);
- one UTF-8 byte order mark opening the stream is skipped.

Data stays bytes (the JSON decoder reads UTF-8 bytes itself). A line longer than ``max_line``
bytes, or an event whose data exceeds it, raises :class:`SSEError`: a server cannot make the
client buffer without bound. Every byte is copied a bounded number of times, so parsing is
linear in the stream's length however it is split.
"""

from __future__ import annotations

#: Default bound on one line, and on one event's data (bytes). vLLM's chunks are a few hundred
#: bytes (kilobytes with logprobs); a line this long is a broken or hostile server.
MAX_LINE_BYTES = 8 << 20

_BOM = b"\xef\xbb\xbf"
_MESSAGE = b"message"


class SSEError(ValueError):
    """The stream breaks a bound (a line or an event too long)."""


class SSEParser:
    """Incremental event-stream parser (see the module docstring). ``feed(piece)`` returns the
    list of ``(type, data)`` events the piece completes."""

    __slots__ = ("max_line", "last_event_id", "retry_ms", "_part", "_cr", "_data", "_dlen", "_type", "_bom")

    def __init__(self, max_line: int = MAX_LINE_BYTES):
        self.max_line = max_line
        self.last_event_id = b""
        self.retry_ms: int | None = None
        self._part = bytearray()   # the line not ended yet
        self._cr = False           # the last piece ended with CR: an LF opening the next ends nothing
        self._data = None          # the event's data lines (None: no data line yet)
        self._dlen = 0             # their total length
        self._type = _MESSAGE
        self._bom = True           # a byte order mark may still open the stream

    def feed(self, chunk: bytes) -> list:
        part = self._part
        # the usual piece: one whole event of one data line (vLLM writes one such piece a token)
        if (chunk[-2:] == b"\n\n" and chunk[:6] == b"data: " and self._data is None and not part
                and chunk.count(b"\n") == 2 and b"\r" not in chunk and not self._cr and not self._bom
                and len(chunk) <= self.max_line):
            kind = self._type
            self._type = _MESSAGE
            return [(kind, chunk[6:-2])]
        if self._bom:
            if part:  # the first bytes of a possible BOM, held back
                chunk = bytes(part) + chunk
                part.clear()
            if len(chunk) < 3 and _BOM.startswith(chunk):
                part += chunk
                return []
            self._bom = False
            if chunk.startswith(_BOM):
                chunk = chunk[3:]
        if not chunk:
            return []
        if self._cr:
            self._cr = False
            if chunk[:1] == b"\n":
                chunk = chunk[1:]
        if b"\r" in chunk:
            if chunk[-1:] == b"\r":
                self._cr = True
            chunk = chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        lines = chunk.split(b"\n")
        n_part = len(part)
        if len(lines) == 1:  # no line ends here
            part += chunk
            if len(part) > self.max_line:
                raise SSEError(f"SSE line over {self.max_line} bytes")
            return []
        if n_part:
            part += lines[0]
            lines[0] = bytes(part)
            part.clear()
        tail = lines.pop()
        if tail:
            part += tail
        mx = self.max_line
        if n_part + len(chunk) > mx and (len(part) > mx or max(map(len, lines)) > mx):
            raise SSEError(f"SSE line over {mx} bytes")
        out = []
        for line in lines:
            if not line:  # dispatch
                data = self._data
                if data is not None:
                    out.append((self._type, data[0] if len(data) == 1 else b"\n".join(data)))
                    self._data = None
                self._type = _MESSAGE
                continue
            if line.startswith(b"data: "):  # the usual form: the fast path
                name = b"data"
                value = line[6:]
            elif line[0] == 58:  # ':' a comment
                continue
            else:
                i = line.find(b":")
                if i < 0:
                    name, value = line, b""
                else:
                    name, value = line[:i], line[i + 1:]
                    if value[:1] == b" ":
                        value = value[1:]
            if name == b"data":
                data = self._data
                if data is None:
                    self._data = [value]
                    self._dlen = len(value)
                else:
                    data.append(value)
                    self._dlen += len(value) + 1
                    if self._dlen > mx:
                        raise SSEError(f"SSE event over {mx} bytes")
            elif name == b"event":
                self._type = value or _MESSAGE
            elif name == b"id":
                if b"\0" not in value:
                    self.last_event_id = value
            elif name == b"retry":
                if value.isdigit():  # bytes.isdigit: ASCII digits only
                    self.retry_ms = int(value)
        return out


__all__ = ["MAX_LINE_BYTES", "SSEError", "SSEParser"]
