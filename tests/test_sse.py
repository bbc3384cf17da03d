from __future__ import annotations

import tracemalloc

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rollcap import sse
from rollcap.sse import SSEDecoder, SSEEvent, encode_event, is_event_stream


def decode(*chunks: bytes, unterminated: bool = False) -> list[SSEEvent]:
    decoder = SSEDecoder()
    events: list[SSEEvent] = []
    for chunk in chunks:
        events += decoder.feed(chunk)
    return events + decoder.flush(dispatch_unterminated=unterminated)


def test_fields_multiline_data_comments_and_ids() -> None:
    raw = (
        b": keep-alive comment\n"
        b"event: delta\nid: 7\ndata: one\ndata: two\nretry: 1500\n\n"
        b"data:no-space\n\n"
        b"event: ignored-without-data\n\n"
        b"data\n\n"
        b"unknown: field\ndata: x\n\n"
    )
    assert decode(raw) == [
        SSEEvent(data="one\ntwo", event="delta", id="7", retry=1500),
        SSEEvent(data="no-space", id="7"),
        SSEEvent(data="", id="7"),
        SSEEvent(data="x", id="7"),
    ]


def test_line_endings_lf_crlf_cr_mixed() -> None:
    expected = [SSEEvent(data="a", event="e"), SSEEvent(data="b")]
    for eol in (b"\n", b"\r\n", b"\r"):
        raw = b"event: e" + eol + b"data: a" + eol + eol + b"data: b" + eol + eol
        assert decode(raw) == expected, eol
    assert decode(b"event: e\r\ndata: a\r\r\ndata: b\n\r\n") == expected


def test_crlf_split_between_cr_and_lf_is_one_line_end() -> None:
    assert decode(b"data: a\r", b"\n\r", b"\n") == [SSEEvent(data="a")]
    assert decode(b"data: a\r", b"\ndata: b\r\n\r\n") == [SSEEvent(data="a\nb")]


def test_utf8_split_inside_a_character() -> None:
    raw = "data: héllo → 世界 🎉\n\n".encode()
    for cut in range(1, len(raw)):
        assert decode(raw[:cut], raw[cut:]) == [SSEEvent(data="héllo → 世界 🎉")], cut


def test_invalid_utf8_is_replaced_not_raised() -> None:
    assert decode(b"data: \xff\xfe\n\n") == [SSEEvent(data="\ufffd\ufffd")]


def test_bom_is_stripped_once() -> None:
    assert decode(b"\xef\xbb\xbfdata: a\n\n") == [SSEEvent(data="a")]


def test_unterminated_event_only_on_request() -> None:
    assert decode(b"data: a\n\ndata: b") == [SSEEvent(data="a")]
    assert decode(b"data: a\n\ndata: b", unterminated=True) == [
        SSEEvent(data="a"),
        SSEEvent(data="b"),
    ]
    decoder = SSEDecoder()
    decoder.feed(b"data: partial")
    assert decoder.has_pending


def test_encode_roundtrip() -> None:
    event = SSEEvent(data='{"a":1}\nsecond', event="response.created", id="3", retry=10)
    assert encode_event(event) == (
        b'event: response.created\nid: 3\nretry: 10\ndata: {"a":1}\ndata: second\n\n'
    )
    assert decode(encode_event(event)) == [event]


@given(st.binary(max_size=400), st.lists(st.integers(min_value=0, max_value=400), max_size=8))
def test_any_bytes_any_split_never_raises_and_split_is_invisible(
    raw: bytes, cuts: list[int]
) -> None:
    points = sorted({min(c, len(raw)) for c in cuts})
    chunks = [raw[a:b] for a, b in zip([0, *points], [*points, len(raw)], strict=True)]
    assert decode(*chunks, unterminated=True) == decode(raw, unterminated=True)


_line_text = st.text(
    alphabet=st.characters(exclude_categories=["Cs"], exclude_characters="\r\n"),
    max_size=30,
)


@given(
    st.lists(
        st.builds(
            SSEEvent,
            data=st.lists(_line_text, min_size=1, max_size=3).map("\n".join),
            event=st.none() | _line_text.filter(lambda s: s != ""),
            id=st.none(),
            retry=st.none(),
        ),
        max_size=6,
    )
)
def test_encoded_events_decode_back(events: list[SSEEvent]) -> None:
    raw = b"".join(encode_event(e) for e in events)
    assert decode(raw) == events


_LINE_TEXT = st.text(
    alphabet=st.characters(exclude_characters="\r\n", exclude_categories=["Cs"]), max_size=12
)
_RAW_BLOCK = st.one_of(
    _LINE_TEXT.map(lambda t: f"data: {t}\n\n"),
    st.tuples(_LINE_TEXT, _LINE_TEXT).map(lambda p: f"event: {p[0]}\ndata: {p[1]}\n\n"),
    st.tuples(_LINE_TEXT, _LINE_TEXT).map(lambda p: f"data: {p[0]}\ndata: {p[1]}\n\n"),
    _LINE_TEXT.map(lambda t: f"id: {t}\ndata: x\n\n"),
    _LINE_TEXT.map(lambda t: f": {t}\n\n"),
    _LINE_TEXT.map(lambda t: f"event: {t}\n\n"),
    _LINE_TEXT.map(lambda t: f"data:{t}\r\n\r\n"),
    st.just("retry: 5\ndata: r\n\n"),
    st.just("data: half"),
    st.just("\n"),
)


@given(st.lists(_RAW_BLOCK, max_size=12))
def test_a_chunk_per_event_decodes_as_the_same_bytes_fed_one_at_a_time(blocks: list[str]) -> None:
    # A chunk that is one whole event takes a shortcut; it must give exactly what the
    # line-by-line path gives, whatever came before it (ids, half events, CRs).
    chunks = [b.encode() for b in ["data: start\n\n", *blocks]]
    whole = SSEDecoder()
    by_chunk = [e for c in chunks for e in whole.feed(c)] + whole.flush(dispatch_unterminated=True)
    single = SSEDecoder()
    stream = b"".join(chunks)
    by_byte = [e for i in range(len(stream)) for e in single.feed(stream[i : i + 1])]
    by_byte += single.flush(dispatch_unterminated=True)
    assert by_chunk == by_byte


@given(
    st.booleans(),
    st.lists(_RAW_BLOCK, max_size=16),
    st.lists(st.integers(min_value=0, max_value=600), max_size=6),
)
def test_chunks_of_many_events_cut_anywhere_decode_as_one_byte_at_a_time(
    bom: bool, blocks: list[str], cuts: list[int]
) -> None:
    # Chunks holding several events, and events cut between chunks, take the shortcut that
    # leaves a coming event's bytes unparsed; the events must be those of the line-by-line
    # path, byte order mark and all, whatever the cuts.
    stream = ("\ufeff" if bom else "").encode() + "".join(blocks).encode()
    points = sorted({min(c, len(stream)) for c in cuts})
    chunks = [stream[a:b] for a, b in zip([0, *points], [*points, len(stream)], strict=True)]
    by_chunk = decode(*chunks, unterminated=True)
    single = SSEDecoder()
    by_byte = [e for i in range(len(stream)) for e in single.feed(stream[i : i + 1])]
    by_byte += single.flush(dispatch_unterminated=True)
    assert by_chunk == by_byte


def test_a_stream_of_plain_events_in_uneven_chunks_keeps_names_ids_and_the_unfinished_one() -> None:
    stream = (
        b"id: 9\n\n"
        + b"".join(b'event: delta\ndata: {"n": %d}\n\n' % i for i in range(5))
        + b"data: last"
    )
    chunks = [stream[:4], stream[4:30], stream[30:31], stream[31:]]
    events = decode(*chunks, unterminated=True)
    assert [e.data for e in events] == [f'{{"n": {i}}}' for i in range(5)] + ["last"]
    assert {e.event for e in events[:5]} == {"delta"}
    assert events[5].event is None
    assert {e.id for e in events} == {"9"}
    assert decode(*chunks) == events[:5]  # the unfinished one only when asked for


@pytest.mark.parametrize(
    ("content_type", "expected"),
    [
        ("text/event-stream", True),
        ("text/event-stream; charset=utf-8", True),
        ("Text/Event-Stream;charset=UTF-8", True),
        ("  text/event-stream  ", True),
        ("application/json", False),
        ("text/event-streams", False),
        ("text/plain; x=text/event-stream", False),
        ("", False),
        (None, False),
    ],
)
def test_is_event_stream_reads_the_media_type_in_any_case(
    content_type: str | None, expected: bool
) -> None:
    assert is_event_stream(content_type) is expected


# --- linear in the bytes fed, bounded by max_line ---------------------------------------------


def test_a_long_line_is_held_once_and_joined_once(monkeypatch: pytest.MonkeyPatch) -> None:
    # A line that keeps coming must not be recopied with every chunk (quadratic in its length):
    # its pieces are held as they came and put together once, when its end arrives. The spy
    # counts what is put together; tracemalloc shows nothing held twice meanwhile.
    joined: list[int] = []
    real = sse._joined

    def spy(pieces: list[bytes]) -> bytes:
        out = real(pieces)
        joined.append(len(out))
        return out

    monkeypatch.setattr(sse, "_joined", spy)
    piece = b"x" * 4096
    chunks = 2048  # an 8 MiB line
    decoder = SSEDecoder()
    tracemalloc.start()
    try:
        decoder.feed(b"data: ")
        for _ in range(chunks):
            assert decoder.feed(piece) == []
        held, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    line = len(piece) * chunks
    assert joined == []  # nothing put together while the line is unfinished
    assert held < 1.2 * line
    assert peak < 1.3 * line
    [event] = decoder.feed(b"\n\n")
    assert len(event.data) == line
    assert joined == [len(b"data: ") + line + len(b"\n\n")]  # once, when it ended


def test_the_join_spy_sees_a_line_put_together_more_than_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A control for the test above: what a recopying decoder does (the line so far put
    # together again with each chunk) shows in the spy as far more bytes than the line.
    joined: list[int] = []
    real = sse._joined

    def spy(pieces: list[bytes]) -> bytes:
        joined.append(sum(map(len, pieces)))
        return real(pieces)

    monkeypatch.setattr(sse, "_joined", spy)
    line = b"data: " + b"x" * 4096
    decoder = SSEDecoder()
    for start in range(0, len(line), 1024):
        decoder.feed(line[start : start + 1024])
    decoder.feed(b"\n\n")
    assert sum(joined) == len(line) + 2  # the decoder: once
    joined.clear()
    for end in range(1024, len(line) + 1, 1024):  # the line so far, again and again
        recopying = SSEDecoder()
        recopying.feed(line[:end])
        recopying.feed(b"\n")
    assert sum(joined) > 2 * len(line)


@pytest.mark.parametrize("eol", [b"\n", b"\r\n", b"\r"])
def test_a_line_past_max_line_is_dropped_whole_and_the_rest_decodes(eol: bytes) -> None:
    decoder = SSEDecoder(max_line=100)
    events = decoder.feed(b"data: first" + eol + eol + b"data: ")
    for _ in range(10):
        events += decoder.feed(b"y" * 30)  # 300 bytes: past the bound
    events += decoder.feed(eol + b"data: after" + eol + eol)
    events += decoder.flush()
    assert [e.data for e in events] == ["first", "after"]
    assert decoder.dropped_lines == 1


def test_max_line_keeps_lines_within_it_and_whole_chunks_of_any_length() -> None:
    long_in_one_chunk = b"data: " + b"z" * 500 + b"\n\n"
    chunks = [b"data: ab", b"cd\n\n", long_in_one_chunk]
    bounded = SSEDecoder(max_line=100)
    events = [e for c in chunks for e in bounded.feed(c)] + bounded.flush()
    assert events == decode(*chunks)
    assert bounded.dropped_lines == 0


def test_a_dropped_line_ending_in_cr_at_a_chunk_end_keeps_crlf_as_one_line_end() -> None:
    decoder = SSEDecoder(max_line=10)
    events = decoder.feed(b"data: " + b"q" * 20)
    events += decoder.feed(b"q\r")
    events += decoder.feed(b"\ndata: next\r\n\r\n")
    assert [e.data for e in events] == ["next"]
